"""Decide and act: one job's signals -> the engine's decision -> commit -> stop -> Slack -> audit.

    outcome = decide_and_act(rt.source(platform).job_signals(job, now), rt, trigger="sweeper")
    handle_alarm(parse_event(raw, AlarmEvent), rt)     # on_alarm: the alarm's job, decided
    handle_recheck(parse_event(raw, RecheckEvent), rt) # on_alarm: a recheck the engine asked for, come due

Only the winner of the commit (state at the version read + audit + event claim, one DynamoDB transaction) acts,
so a duplicated event or two alarms of one job racing never stop twice or post twice; the stop goes before
Slack, and a Slack failure is recorded, never raised: the message is kept, and the sweeper posts it again
(`repost.resend_pending_posts`). A decision that acts is committed as unfinished; one transaction records what
acting did and finishes it. One left unfinished (its Lambda timed out) is decided again by the sweeper, from the
state before it. A stop that fails says so, and its retries update that message (bot token) or stay silent
until the stop succeeds (webhook): one message per failed stop, never one per sweep.

When a decision says a rule turns decisive at a known time (`Decision.recheck_at`) and that time moved, the winner
schedules a recheck then (`aws.rechecks`, one call); a failure to schedule is logged and counted, never raised,
and the sweeper's rule (`engine.sweeper_due`) decides the job at its next run instead. A decision that needs no
recheck deletes the one still pending (one call; a failure logged, never raised).

A job that has ended, or no longer exists, is never decided: no state item is written, its alarms are deleted (and
an ended job's open incident closed, as its end event would). An alarm's job is read (DescribeTrainingJob or
DescribeInstances, which the decision's signals then reuse) before anything is written for it, so a job that does not
exist costs the table nothing: no claim, no delete. Only a job this container found running a moment ago
(`Runtime.found_running`, within the coalescing window) is claimed at once: the rest of its alarm burst costs one
UpdateItem each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws import actions
from stallwatch.aws.events import AlarmActionEvent, AlarmStateChange, RecheckEvent
from stallwatch.aws.job_states import ConcurrentDecisionError, StoredState
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.slack import AlertMessage, Evidence, PostResult
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, contract, engine
from stallwatch.core.config import ALARM_COALESCE_SECONDS, SWEEPER_TIMEOUT_SECONDS
from stallwatch.core.decision import NOT_PROBLEMS, Action, Decision
from stallwatch.core.platforms import job_name_error
from stallwatch.core.policy import Mode
from stallwatch.core.resume import RECOVERY_OUTCOME
from stallwatch.core.signals import JobFacts, JobSignals, Platform
from stallwatch.runtime import settle, way_back
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.provision import delete_job_alarms, retire_job

POSTED_ACTIONS = frozenset({Action.ALERT, Action.WARN, Action.STOP})
COALESCE_SECONDS = ALARM_COALESCE_SECONDS  # an alarm of a job decided (or being decided) this recently is coalesced
# The longest a deciding Lambda runs (the sweeper's timeout): an unfinished decision older
# than this was abandoned by a Lambda that timed out, and the sweeper decides it again.
ABANDONED_AFTER_SECONDS = SWEEPER_TIMEOUT_SECONDS + 60


@dataclass
class Outcome:
    """What one decision did: the handler's return value, and logged with the audit record."""

    job: str
    status: str  # decided, duplicate, coalesced, skipped (a recheck decided since), ignored, off, not_found, ended
    diagnosis: str | None = None
    action: str | None = None
    stopped: bool | None = None
    posted: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}


def handle_alarm(event: AlarmActionEvent | AlarmStateChange, rt: Runtime) -> dict[str, Any]:
    """An alarm fired (ALARM; a gpu-memory alarm also on INSUFFICIENT_DATA, its host's data gone: `alarms.acts_on`):
    look at its job and act on what the engine decides."""
    alarm = event.alarm
    state = alarm.state.value
    ignored = {"reason": f"alarm state {state}"}
    if state not in alarms.ACTING_STATES:
        return Outcome(job="", status="ignored", details=ignored).as_dict()
    try:
        ref = alarms.parse_alarm_name(alarm.alarm_name, rt.config.alarm_prefix)
        error = job_name_error(ref.job, ref.platform)
        if error is not None:  # no platform has such a job: nothing is read or written for it
            raise ValueError(error)
    except ValueError as exc:
        logger.warning("ignoring an alarm Stallwatch did not create", extra={"error": str(exc)})
        return Outcome(job="", status="ignored", details={"reason": str(exc)}).as_dict()
    if not alarms.acts_on(ref.kind, state):
        return Outcome(job=ref.job, status="ignored", details=ignored).as_dict()
    now = rt.clock()
    facts = None
    if not rt.found_running(ref.platform, ref.job, now):  # the job must exist before anything is written for it
        try:
            facts = rt.source(ref.platform).facts(ref.job)
        except JobNotFoundError as exc:  # its alarms go; the table is not written to
            deleted = delete_job_alarms(rt, ref.platform, ref.job, forget=False)
            return Outcome(ref.job, "not_found", details={"reason": str(exc), "alarms_deleted": deleted}).as_dict()
        if facts.status.ended:
            return _retired(rt, ref.platform, ref.job, facts.status)
        rt.saw_running(ref.platform, ref.job, now)
    read = rt.states.claim_decision(job_key(ref.platform, ref.job), now, COALESCE_SECONDS)
    if read is None:  # another alarm of the job is being decided, or was a moment ago: one read for the burst
        metrics.add_metric(name=contract.COALESCED_ALARMS, unit=MetricUnit.Count, value=1)
        return Outcome(job=ref.job, status="coalesced", details={"reason": "the job's claim is held"}).as_dict()
    return _decide_claimed(rt, ref.platform, ref.job, read, now, alarm.alarm_name, alarm.dedup_key, facts)


def handle_recheck(event: RecheckEvent, rt: Runtime) -> dict[str, Any]:
    """A recheck the engine asked for came due: decide on its job, unless a decision was committed at or after its
    time (that one looked already). It is never coalesced into a claim held since before its time: an alarm decided
    a minute before it did not see what it is for."""
    now = rt.clock()
    read = rt.states.claim_decision(job_key(event.platform, event.job), now, COALESCE_SECONDS, undecided_since=event.at)
    if read is None:
        details = {"reason": "decided at or after the recheck's time", "at": event.at}
        return Outcome(job=event.job, status="skipped", details=details).as_dict()
    return _decide_claimed(rt, event.platform, event.job, read, now, "recheck", event.dedup_key)


def _decide_claimed(
    rt: Runtime,
    platform: Platform,
    job: str,
    read: StoredState,
    now: float,
    trigger: str,
    event_key: str,
    facts: JobFacts | None = None,
) -> dict[str, Any]:
    """Decide on a job this invocation holds the claim of (`facts`: the job's, if just read). One that no longer
    exists or has ended is not decided: its claim is given back and its alarms deleted (an ended job retired, as its
    end event would)."""
    try:
        signals = rt.source(platform).job_signals(job, now, facts=facts)
    except JobNotFoundError as exc:
        rt.states.release_claim(job_key(platform, job))
        deleted = delete_job_alarms(rt, platform, job)
        return Outcome(job, "not_found", details={"reason": str(exc), "alarms_deleted": deleted}).as_dict()
    if signals.facts.status.ended:  # a late alarm: retired as the end event does, nothing decided
        rt.states.release_claim(job_key(platform, job))
        return _retired(rt, platform, job, signals.facts.status)
    rt.saw_running(platform, job, now)
    outcome = decide_and_act(
        signals, rt, trigger=trigger, event_key=event_key, read=read, hold_until=now + COALESCE_SECONDS
    )
    return outcome.as_dict()


def _retired(rt: Runtime, platform: Platform, job: str, status: str) -> dict[str, Any]:
    retired = retire_job(rt, platform, job, status)
    details = {"reason": f"job {status}", "alarms_deleted": retired["alarms_deleted"]}
    return Outcome(job=job, status="ended", details=details).as_dict()


def decide_and_act(
    signals: JobSignals,
    rt: Runtime,
    trigger: str,
    event_key: str | None = None,
    read: StoredState | None = None,
    hold_until: float | None = None,
) -> Outcome:
    """Decide on one job and, if this invocation wins the commit, stop and/or alert. `read`: the job's state, if
    the caller has read it already (the sweeper, in batches; on_alarm, with its claim); `hold_until`: how long the
    job's claim outlives the decision."""
    facts = signals.facts
    effective = rt.config.policy.for_job(facts.tags)
    if effective.mode is Mode.OFF:
        return Outcome(job=facts.name, status="off")
    key = job_key(facts.platform, facts.name)
    read = read if read is not None else rt.states.load(key)
    if abandoned(read, signals.now):
        logger.warning("deciding again after an unfinished decision", extra={"job": facts.name, **read.unfinished})
        read = read.before_unfinished()
    decision = engine.decide(signals, effective, read.state, signals.now)
    written, close = _next_stored(read, decision)
    audit = {
        "at": decision.at,
        "job": facts.name,
        "platform": facts.platform.value,
        "trigger": trigger,
        "event": event_key,
        "mode": decision.mode.value,
        "diagnosis": decision.diagnosis.value,
        "action": decision.action.value,
        "would": decision.would.value,
        "reasons": list(decision.reasons),
        "evidence": decision.evidence,
        "may_stop": effective.may_stop,
        "tag_errors": [*facts.tag_errors, *effective.tag_errors],
    }
    try:
        acting = decision.action in POSTED_ACTIONS
        audit_sk = rt.states.commit(
            key,
            read,
            written,
            audit,
            signals.now,
            event_key=event_key,
            close_incident=close,
            acting=acting,
            hold_until=hold_until,
        )
    except ConcurrentDecisionError as exc:
        logger.info("decision not committed: duplicate event or concurrent decision", extra={"error": str(exc)})
        metrics.add_metric(name=contract.DUPLICATE_DECISIONS, unit=MetricUnit.Count, value=1)
        return Outcome(job=facts.name, status="duplicate", details={"reason": str(exc)})
    metrics.add_metric(name=contract.DECISIONS, unit=MetricUnit.Count, value=1)
    outcome = Outcome(
        job=facts.name, status="decided", diagnosis=decision.diagnosis.value, action=decision.action.value
    )
    _act(signals, rt, decision, written, key, audit_sk, outcome)
    _schedule_recheck(rt, facts, decision, read.state.recheck_at, outcome)
    logger.info("decision", extra={"audit": audit, "outcome": outcome.as_dict()})
    return outcome


def _next_stored(read: StoredState, decision: Decision) -> tuple[StoredState, str | None]:
    """The state to write, and the incident to close (if the job is no longer a problem)."""
    state = engine.next_state(read.state, decision)
    if decision.diagnosis in NOT_PROBLEMS:
        return StoredState(state, read.version, None), read.incident
    incident = read.incident or f"incident#{decision.at:017.3f}"
    return StoredState(state, read.version, incident, stop_post=read.stop_post), None


def abandoned(stored: StoredState, now: float) -> bool:
    """A decision committed to act whose Lambda ended (timed out) before it recorded what it did."""
    if stored.unfinished is None or stored.updated_at is None:
        return False
    return now - stored.updated_at > ABANDONED_AFTER_SECONDS


def _act(
    signals: JobSignals,
    rt: Runtime,
    decision: Decision,
    written: StoredState,
    key: str,
    audit_sk: str,
    outcome: Outcome,
) -> None:
    """Stop first, then Slack; record both results and finish the decision in one write. Never raises: the
    decision is committed (and its event claimed) already, so a raise would turn Lambda's retry into a duplicate
    and lose the action. A stop that fails or raises is released for the sweeper to retry; a message that rendered
    but was not delivered is kept for the sweeper to post again.

    The engine repeats no action (`JobState.alerted`, `warned_at`, `stopped_at`), so each one happens once."""
    if decision.action not in POSTED_ACTIONS:
        return
    job = signals.facts.name
    result: dict[str, Any] = {}
    # A job that opted in to its platform's way back in place (a restart in place, a requeue) takes it, within its
    # run's budget, in place of the plain stop (runtime.way_back: the platform's adapter holds it).
    recovery = way_back.instead_of_stop(rt, signals, decision, written.state, audit_sk)
    if recovery is not None:
        result[RECOVERY_OUTCOME] = recovery.audited
    recovering = recovery is not None and recovery.recovering
    if recovery is not None and recovery.stop is not None:  # the way back is the stop (a requeue)
        stop_result: actions.StopResult | None = _counted(signals, recovery.stop)
    elif decision.action is Action.STOP and not recovering:
        stop_result = _stop(rt, signals)
    else:
        stop_result = None
    stop_post = written.stop_post
    if stop_result is not None:
        outcome.stopped = stop_result.ok
        result["stop"] = {"ok": stop_result.ok, "detail": stop_result.detail}
        if stop_result.commands:  # its answer comes later: the sweeper reads it (runtime.settle)
            result["stop"]["commands"] = list(stop_result.commands)
    message: dict[str, Any] | None = None
    try:
        evidence = Evidence.of(decision, signals, written.state.stall_since)
        attempts = (stop_post or {}).get("failures", 0) + 1
        if recovery is not None and recovery.message is not None:  # recovering: its message, in place of a stop's
            message = recovery.message
        else:
            shown = recovery.reasons_of(decision) if recovery is not None else decision
            message = AlertMessage(
                shown, signals.facts, evidence, stop_result, written.incident, rt.deployment_id, attempts
            ).render()
        post, stop_post = _deliver(rt, message, stop_result, stop_post)
    except Exception as exc:  # a bug in rendering or posting: recorded like a failed post, never raised
        step = "post" if message is not None else "render"
        logger.exception("Slack message failed to render or post", extra={"job": job, "step": step})
        post = PostResult(ok=False, detail=f"{step}: {type(exc).__name__}: {exc}")
    outcome.posted = post.ok
    result["slack"] = post.audited()
    outcome.details.update(result)
    unsent = message if not post.ok and message is not None else None
    if unsent is not None:
        metrics.add_metric(name=contract.SLACK_FAILURES, unit=MetricUnit.Count, value=1)
        logger.error("Slack post failed; the sweeper will post it again", extra={"job": job, "detail": post.detail})
        result["slack_attempts"] = [{"at": signals.now, "ok": False, "detail": post.detail}]
    released = stop_result is not None and not stop_result.ok
    try:
        finished = StoredState(written.state, written.version, written.incident, stop_post=stop_post)
        rt.states.finish_decision(key, audit_sk, result, finished, signals.now, released, unsent)
    except Exception:  # the actions happened; the sweeper completes the unfinished decision
        logger.exception("could not record the outcome", extra={"job": job, "audit": audit_sk, "outcome": result})
    if stop_result is not None:
        settle.track(rt, key, audit_sk, signals.facts, stop_result, signals.now)


def _schedule_recheck(
    rt: Runtime, facts: JobFacts, decision: Decision, scheduled_at: float | None, outcome: Outcome
) -> None:
    """Have the job decided again at `decision.recheck_at`: one Scheduler call when that time moved from the one
    scheduled before (`scheduled_at`), none after a stop; a decision that asks for none deletes a pending one (one
    call). After the actions, so it never delays a stop or a post; a failure is logged (a failed schedule counted),
    never raised (the sweeper decides a due recheck, `engine.sweeper_due`)."""
    at = decision.recheck_at
    pending = scheduled_at is not None and scheduled_at > decision.at  # fires at or after its time: not yet
    if rt.rechecks is not None and at is None and pending:
        _cancel_recheck(rt, facts, outcome)
    if rt.rechecks is None or at is None or at == scheduled_at or decision.action is Action.STOP:
        return
    try:
        scheduled = rt.rechecks.schedule(facts.platform, facts.name, at, decision.at, pending=pending)
    except Exception as exc:  # an API error or a bug: the recheck is the sweeper's
        logger.exception("could not schedule the recheck; the sweeper decides it", extra={"job": facts.name, "at": at})
        metrics.add_metric(name=contract.RECHECK_SCHEDULE_FAILURES, unit=MetricUnit.Count, value=1)
        outcome.details["recheck"] = {"at": at, "ok": False, "detail": f"{type(exc).__name__}: {exc}"}
        return
    outcome.details["recheck"] = {"at": at, "ok": True, "fires_at": scheduled.fires_at, "schedule": scheduled.name}


def _cancel_recheck(rt: Runtime, facts: JobFacts, outcome: Outcome) -> None:
    """Delete the job's pending recheck, which no decision needs any more; a failure is logged, never raised (the
    recheck then fires, finds a decision newer than its time, and is skipped)."""
    assert rt.rechecks is not None
    try:
        deleted = rt.rechecks.cancel(facts.platform, facts.name)
    except Exception as exc:  # an API error or a bug: only a skipped invocation is at stake
        logger.exception("could not delete the recheck no decision needs", extra={"job": facts.name})
        outcome.details["recheck"] = {"cancelled": False, "detail": f"{type(exc).__name__}: {exc}"}
        return
    outcome.details["recheck"] = {"cancelled": deleted}


def _deliver(
    rt: Runtime, message: dict[str, Any], stop: actions.StopResult | None, stop_post: dict[str, Any] | None
) -> tuple[PostResult, dict[str, Any] | None]:
    """Post the message; for a stop after failed ones, update the failure message (bot token) or post once more
    when the stop went through (webhook), and stay silent while it keeps failing. Returns the post and the failed
    stop's message to remember (None once the stop went through)."""
    if stop is None or stop_post is None:
        post = rt.notifier.post(message)
        if stop is None or stop.ok:
            return post, stop_post if stop is None else None
        return post, {"channel": post.channel, "ts": post.ts, "failures": 1}
    failures = stop_post["failures"] + (0 if stop.ok else 1)
    if stop_post.get("ts") and rt.notifier.can_update():
        post = rt.notifier.update(message, stop_post["channel"], stop_post["ts"])
    elif stop.ok:
        post = rt.notifier.post(message)
    else:
        post = PostResult(ok=True, detail=f"not posted: failed stop {failures} of this incident, reported already")
    return post, None if stop.ok else {**stop_post, "failures": failures}


def _stop(rt: Runtime, signals: JobSignals) -> actions.StopResult:
    """`actions.stop`, with any failure (returned or raised) counted and logged; `_act` releases it."""
    try:
        stopped = actions.stop(rt.source(signals.facts.platform), signals.facts)
    except Exception as exc:  # actions.stop returns API errors; anything raised is a bug, treated as a failed stop
        logger.exception("stop raised; the sweeper will retry", extra={"job": signals.facts.name})
        stopped = actions.StopResult(ok=False, detail=f"{type(exc).__name__}: {exc}")
    return _counted(signals, stopped)


def _counted(signals: JobSignals, stopped: actions.StopResult) -> actions.StopResult:
    """A stop's result (the plain stop's, or a way back's that is the stop), counted, and logged where it failed."""
    metrics.add_metric(
        name=contract.JOBS_STOPPED if stopped.ok else contract.STOP_FAILURES, unit=MetricUnit.Count, value=1
    )
    if not stopped.ok:
        logger.error("stop failed; the sweeper will retry", extra={"job": signals.facts.name, "detail": stopped.detail})
    return stopped
