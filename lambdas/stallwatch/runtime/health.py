"""AWS Health's scheduled events for the EC2 instances watched jobs run on: each job told (on_health_event), and
moved off the instance before the window where it opted in (the sweeper).

    on_health_event(event, rt)      # each watched job on an affected instance: Slack and `stallwatch status`, once
    continue_host_moves(rt, now)    # the sweeper: each planned move at its quiet moment before the window

The jobs are found through the platforms whose hosts are instances (`PlatformDescription.instance_hosts`): each
running job's host on the instance (`host_of_instance`). The first delivery of an event tells each such job the
instance, the event, the window and the age of its last checkpoint, and plans its move where the job opted in (the
stop opt-in and `host_move_tags`); AWS's updates of the event (the same ARN) change nothing, except that a closed event
calls its planned moves off. A planned move is made right after a checkpoint ends within a day of the window, else an
hour before it (`core.health_events.move_due`), within the run's restart budget, by the platform's way back in place
(`PlatformAdapter.way_back`, a move): restarted in place without the host, or requeued with the node drained. Each step
is audited on the job; Slack text quoting the event is escaped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.health_events import HealthEvent
from stallwatch.aws.host_events import HostEvents, PlannedMove
from stallwatch.aws.log_reads import newest_marker
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.slack import follow_up
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core import contract, log_patterns
from stallwatch.core import health_events as rules
from stallwatch.core.platforms import DESCRIPTIONS, describe
from stallwatch.core.platforms.interface import StopResult, WayBackAttempt
from stallwatch.core.policy import Mode
from stallwatch.core.reading import LOOKBACK_SECONDS
from stallwatch.core.resume import NoResume
from stallwatch.core.signals import JobFacts, JobStatus, Platform
from stallwatch.core.way_back import WayBack
from stallwatch.runtime import settle
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.repost import SlackTeller, post_safely, record_post
from stallwatch.runtime.way_back import attempts_so_far

MOVES_PER_SWEEP = 10  # the planned moves whose windows come first; each due one reads its job's signals
TRIGGER = "aws-health"


@dataclass(frozen=True)
class JobOnInstance:
    """A running job whose host is on an instance an event names."""

    platform: Platform
    facts: JobFacts
    host: str
    instance: str


def on_health_event(event: HealthEvent, rt: Runtime) -> dict[str, Any]:
    """An AWS Health event: every watched job on an instance it names is told once, and its move planned where it
    opted in; a closed event calls its planned moves off. Anything but an EC2 scheduled change is ignored."""
    detail = event.detail
    if not detail.scheduled:
        reason = f"{detail.service} {detail.event_type_category} event, not an EC2 scheduled change"
        return {"status": "ignored", "reason": reason[:200]}
    now = rt.clock()
    if detail.closed:
        return {"status": "closed", "called_off": _call_off(rt, detail.event_arn, now)}
    instances = event.instances()
    if not instances:
        return {"status": "ignored", "reason": "the event names no EC2 instance"}
    found = list(jobs_on(rt, instances, now))
    metrics.add_metric(name=contract.HOST_EVENTS, unit=MetricUnit.Count, value=len(found))
    return {"status": "handled", "instances": instances, "jobs": [_tell(rt, event, hit, now) for hit in found]}


def jobs_on(rt: Runtime, instances: list[str], now: float) -> Iterator[JobOnInstance]:
    """The running jobs of the watched platforms whose hosts are instances, with a host on one of `instances`; a
    platform whose listing fails is logged and skipped."""
    for platform, description in DESCRIPTIONS.items():
        if not description.instance_hosts or not rt.config.watches(platform):
            continue
        source = rt.source(platform)
        try:
            running = source.running_jobs(now)
        except Exception:
            logger.exception("could not list the running jobs", extra={"platform": platform.value})
            continue
        for name, listed in running.items():
            try:
                facts = listed or source.facts(name)
            except JobNotFoundError:
                continue
            for instance in instances:
                host = description.host_of_instance(facts, instance)
                if host is not None:
                    yield JobOnInstance(platform, facts, host, instance)


def _tell(rt: Runtime, event: HealthEvent, hit: JobOnInstance, now: float) -> dict[str, Any]:
    """The job's notice: kept (once per event and host), audited, posted; its move planned where it opted in."""
    facts, detail = hit.facts, event.detail
    description = describe(hit.platform)
    effective = rt.config.policy.for_job(facts.tags)
    if effective.mode is Mode.OFF:
        return {"job": facts.name, "status": "off"}
    start, end = detail.window()
    movable = effective.may_stop and description.moves_off_hosts(facts)
    over = end is not None and end <= now
    notice = rules.HostNotice(
        event_arn=detail.event_arn,
        code=detail.event_type_code,
        instance=hit.instance,
        host=hit.host,
        start=start,
        end=end,
        received_at=now,
        move=str(description.way_back) if movable else "",
        state=rules.PLANNED if movable and not over else rules.TOLD,
        detail="its window is over" if over else "",
        description=detail.description()[: rules.DESCRIPTION_CHARS],
    )
    checkpoint = _last_checkpoint(rt, hit.platform, facts, now)
    key = job_key(hit.platform, facts.name)
    audit = _audit(facts, now, rules.NOTICE_ACTION, notice) | {"last_checkpoint": checkpoint}
    audit_sk = HostEvents(rt.store).notify(key, hit.platform, facts.name, notice, audit, now)
    if audit_sk is None:
        return {"job": facts.name, "status": "duplicate", "instance": hit.instance}
    text = rules.notice_text(facts.name, notice, checkpoint, now, rules.plan_text(notice, description.host_move_tags))
    message = follow_up(text)
    record_post(rt, key, audit_sk, {"notice": notice.state}, message, post_safely(rt, message), now)
    return {"job": facts.name, "status": notice.state, "instance": hit.instance, "host": hit.host}


def _call_off(rt: Runtime, event_arn: str, now: float) -> list[dict[str, Any]]:
    """AWS closed the event (over, or called off): its planned moves are dropped, each audited and told."""
    events = HostEvents(rt.store)
    reports = []
    for move in events.of_event(event_arn):
        reports.append(_drop(rt, events, move, now, "AWS closed the event"))
    return reports


# ---- the sweeper: each planned move at its quiet moment -----------------------------------------------------------


def continue_host_moves(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """Each planned move whose window comes first (`MOVES_PER_SWEEP`): made when due, dropped when its job ended or
    left the host; one that fails is logged and counted, and looked at again by the next sweep."""
    events = HostEvents(rt.store)
    reports = []
    for move in events.planned(MOVES_PER_SWEEP):
        try:
            reports.append(_advance(rt, events, move, now))
        except Exception as exc:
            logger.exception("could not continue a move off a host", extra={"job": move.job, "host": move.notice.host})
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
            reports.append({"job": move.job, "status": "error", "reason": f"{type(exc).__name__}: {exc}"})
    return reports


def _advance(rt: Runtime, events: HostEvents, move: PlannedMove, now: float) -> dict[str, Any]:
    notice = move.notice
    if now >= notice.over_at:
        return _drop(rt, events, move, now, "its window passed before a quiet moment came")
    source = rt.source(move.platform)
    try:
        facts: JobFacts | None = source.facts(move.job)
    except JobNotFoundError:
        facts = None
    if facts is None or facts.status != JobStatus.RUNNING:
        return _drop(rt, events, move, now, "the job ended", tell=False)
    if notice.host not in describe(move.platform).host_names(facts):
        return _drop(rt, events, move, now, f"the job no longer runs on {notice.host}", tell=False)
    if not rules.watching(notice.start, now):
        return {"job": move.job, "status": "waiting", "watching_from": notice.start - rules.QUIET_SPAN_S}
    if source.way_back_under_way(move.job):
        return {"job": move.job, "status": "waiting", "reason": "its way back is under way"}
    checkpoint = _last_checkpoint(rt, move.platform, facts, now)
    why = rules.move_due(notice.start, now, checkpoint)
    if why is None:
        return {"job": move.job, "status": "waiting", "last_checkpoint": checkpoint}
    done = attempts_so_far(rt, move.job_key, None)[0] + _requeued(events, move.job_key)
    budget = rules.plan_move(facts.tags, rt.config.policy.resume_max_restarts, done)
    if isinstance(budget, NoResume):
        return _drop(rt, events, move, now, budget.reason, state=rules.NOT_MOVED)
    audit = _audit(facts, now, rules.MOVE_ACTION, notice) | {"why": why, "attempt": budget[0], "allowed": budget[1]}
    audit_sk = events.take(move, notice.with_state(rules.MOVING, why), audit, now)
    if audit_sk is None:
        return {"job": move.job, "status": "claimed_elsewhere"}
    metrics.add_metric(name=contract.HOST_MOVES, unit=MetricUnit.Count, value=1)
    return _move(rt, events, move, facts, now, why, audit_sk, budget)


def _move(
    rt: Runtime,
    events: HostEvents,
    move: PlannedMove,
    facts: JobFacts,
    now: float,
    why: str,
    audit_sk: str,
    budget: tuple[int, int],
) -> dict[str, Any]:
    """The job moved off the host by its platform's way back in place (`PlatformAdapter.way_back`, a move): restarted
    in place without it (the sweeper continues it), or requeued with the node drained (the platform's answer read by
    the sweeper, `settle`); a job that cannot lose the host runs on, and Slack hears why, in the notice's thread."""
    notice = move.notice
    attempt = WayBackAttempt(
        facts=facts,
        decided_at=now,
        decision_sk=move.audit_sk,
        stall_since=now,
        diagnosis=rules.MOVE_DIAGNOSIS,
        reasons=(),
        step=_step(rt, move.platform, facts, now),
        stall_onset=now,
        attempt=budget[0],
        allowed=budget[1],
        blamed={notice.host: (f"{rules.impact(notice.code)} from {rules.when(notice.start)}, {why}",)},
        moving=True,
    )
    result = rt.source(facts.platform).way_back(attempt, SlackTeller(rt))
    if result.stop is not None:
        return _requeued_off(rt, events, move, facts, now, why, audit_sk, result.stop)
    if result.reason is not None:
        reason = f"not moved: {result.reason}; it runs on until the window"
        events.update(move.job_key, notice.with_state(rules.NOT_MOVED, reason))
        _follow(rt, move, audit_sk, f":warning: `{move.job}`: {reason}", {"move": result.audited}, now)
        return {"job": move.job, "status": "not_moved", "move": notice.move, "why": why}
    events.update(move.job_key, notice.with_state(rules.MOVED, f"restarting in place without it ({why})"))
    _record(rt, move.job_key, audit_sk, {"move": result.audited})
    return {"job": move.job, "status": result.audited.get("status"), "move": notice.move, "why": why}


def _requeued_off(
    rt: Runtime,
    events: HostEvents,
    move: PlannedMove,
    facts: JobFacts,
    now: float,
    why: str,
    audit_sk: str,
    stopped: StopResult,
) -> dict[str, Any]:
    """A move that is the job's stop (a requeue with the node drained): its answer is read by the sweeper."""
    notice = move.notice
    state = rules.MOVED if stopped.ok else rules.NOT_MOVED
    events.update(move.job_key, notice.with_state(state, f"requeued without {notice.host} ({why}): {stopped.detail}"))
    text = f":arrows_counterclockwise: `{move.job}`: moving off {notice.host} before AWS's {rules.impact(notice.code)}"
    text += f" ({why}): {stopped.detail}" if stopped.ok else f": FAILED: {stopped.detail}; it runs on until the window"
    stop = {"ok": stopped.ok, "detail": stopped.detail, "commands": list(stopped.commands)}
    _follow(rt, move, audit_sk, text, {"stop": stop}, now)
    settle.track(rt, move.job_key, audit_sk, facts, stopped, now)
    return {"job": move.job, "status": state, "move": notice.move, "why": why}


def _drop(
    rt: Runtime,
    events: HostEvents,
    move: PlannedMove,
    now: float,
    reason: str,
    state: str = rules.CANCELLED,
    tell: bool = True,
) -> dict[str, Any]:
    """A planned move that will not be made: taken, audited, and (`tell`) Slack told why."""
    notice = move.notice
    audit = {
        "at": now,
        "job": move.job,
        "platform": move.platform.value,
        "trigger": TRIGGER,
        "action": rules.MOVE_ACTION,
        "event": notice.event_arn,
        "host": notice.host,
        "state": state,
        "reason": reason,
    }
    audit_sk = events.take(move, notice.with_state(state, reason), audit, now)
    if audit_sk is None:
        return {"job": move.job, "status": "claimed_elsewhere"}
    if tell:
        _follow(rt, move, audit_sk, f":information_source: `{move.job}`: no move off {notice.host}: {reason}", {}, now)
    return {"job": move.job, "status": state, "reason": reason}


def _requeued(events: HostEvents, key: str) -> int:
    """The job's earlier moves by requeue: restarts of its run the recovery's count does not hold."""
    return sum(1 for n in events.notices(key) if n.state == rules.MOVED and n.move == WayBack.REQUEUE)


# ---- reads, records and Slack -------------------------------------------------------------------------------------


def _last_checkpoint(rt: Runtime, platform: Platform, facts: JobFacts, now: float) -> float | None:
    """When the job's newest checkpoint ended: its end line in its hosts' logs within the reads' lookback (the job's
    own checkpoint lines too, where its policy adds some); None when none did, or its logs cannot be read (logged)."""
    try:
        selections = rt.source(platform).history(facts.name).log_selections
        patterns = rt.config.policy.for_job(facts.tags).line_patterns
        start = now - LOOKBACK_SECONDS
        return newest_marker(rt.clients.logs, selections, start, now, patterns, log_patterns.CHECKPOINT_END)
    except Exception:
        logger.exception("could not read the job's checkpoint lines", extra={"job": facts.name})
        return None


def _step(rt: Runtime, platform: Platform, facts: JobFacts, now: float) -> float | None:
    """The step the job has reached (the agent's), for the restart's no-progress rule; None without it."""
    try:
        step = rt.source(platform).job_signals(facts.name, now, facts=facts).agent.get("Step")
    except Exception:
        logger.exception("could not read the job's step", extra={"job": facts.name})
        return None
    return step.latest() if step is not None else None


def _audit(facts: JobFacts, now: float, action: str, notice: rules.HostNotice) -> dict[str, Any]:
    return {
        "at": now,
        "job": facts.name,
        "platform": facts.platform.value,
        "trigger": TRIGGER,
        "action": action,
        "event": notice.event_arn,
        "code": notice.code,
        "instance": notice.instance,
        "host": notice.host,
        "window": [notice.start, notice.end],
        "move": notice.move,
        "state": notice.state,
    }


def _record(rt: Runtime, key: str, audit_sk: str, outcome: dict[str, Any]) -> None:
    try:
        rt.audit.record_outcome(key, audit_sk, outcome)
    except Exception:  # what was done is done; only its record would be missing
        logger.exception("could not record a move's outcome", extra={"job": key, "audit": audit_sk})


def _follow(rt: Runtime, move: PlannedMove, audit_sk: str, text: str, outcome: dict[str, Any], now: float) -> None:
    """`text` in the notice's thread (bot mode), recorded on the step's audit record; never raises."""
    try:
        thread = HostEvents(rt.store).thread_of(move.job_key, move.audit_sk)
    except Exception:
        logger.exception("could not read the notice's Slack thread", extra={"job": move.job})
        thread = None
    message = follow_up(text, thread)
    record_post(rt, move.job_key, audit_sk, outcome, message, post_safely(rt, message), now)
