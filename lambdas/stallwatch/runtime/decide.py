"""Decide and act: one job's signals -> the engine's decision -> commit -> stop -> Slack -> audit.

    outcome = decide_and_act(rt.source(Platform.SAGEMAKER).job_signals(job, now), rt, trigger="sweeper")
    handle_alarm(parse_event(raw, AlarmEvent), rt)   # on_alarm: the alarm's job, decided

Only the winner of the commit (state at the version read + audit + event claim, one DynamoDB transaction) acts,
so a duplicated event or two alarms of one job racing never stop twice or post twice; the stop goes before
Slack, and a Slack failure is recorded, never raised: the message is kept, and the sweeper posts it again
(`repost.resend_pending_posts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws import actions
from stallwatch.aws.events import AlarmActionEvent, AlarmStateChange
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.slack import AlertMessage, Evidence, PostResult
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import ConcurrentDecisionError, StoredState, job_key
from stallwatch.core import alarms, contract, engine
from stallwatch.core.decision import Action, Decision
from stallwatch.core.policy import Mode
from stallwatch.core.signals import JobSignals
from stallwatch.runtime.environment import Runtime

POSTED_ACTIONS = frozenset({Action.ALERT, Action.WARN, Action.STOP})
# An alarm of a job decided (or being decided) less than this ago is coalesced into that decision: a hang fires
# every host's alarms within an alarm period or two. One it skips is still seen: the sweeper decides a job whose
# alarm went to ALARM after its last decision.
COALESCE_SECONDS = 120


@dataclass
class Outcome:
    """What one decision did: the handler's return value, and logged with the audit record."""

    job: str
    status: str  # decided, duplicate, coalesced, ignored, off, not_found
    diagnosis: str | None = None
    action: str | None = None
    stopped: bool | None = None
    posted: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}


def handle_alarm(event: AlarmActionEvent | AlarmStateChange, rt: Runtime) -> dict[str, Any]:
    """An alarm fired: look at its job and act on what the engine decides."""
    alarm = event.alarm
    if alarm.state.value != "ALARM":
        return Outcome(job="", status="ignored", details={"reason": f"alarm state {alarm.state.value}"}).as_dict()
    try:
        ref = alarms.parse_alarm_name(alarm.alarm_name, rt.config.alarm_prefix)
    except ValueError as exc:
        logger.warning("ignoring an alarm Stallwatch did not create", extra={"error": str(exc)})
        return Outcome(job="", status="ignored", details={"reason": str(exc)}).as_dict()
    now = rt.clock()
    read = rt.store.claim(job_key(ref.platform, ref.job), now, COALESCE_SECONDS)
    if read is None:  # another alarm of the job is being decided, or was a moment ago: one read for the burst
        metrics.add_metric(name=contract.COALESCED_ALARMS, unit=MetricUnit.Count, value=1)
        return Outcome(job=ref.job, status="coalesced", details={"reason": "the job's claim is held"}).as_dict()
    try:
        signals = rt.source(ref.platform).job_signals(ref.job, now)
    except JobNotFoundError as exc:
        return Outcome(job=ref.job, status="not_found", details={"reason": str(exc)}).as_dict()
    outcome = decide_and_act(
        signals, rt, trigger=alarm.alarm_name, event_key=alarm.dedup_key, read=read, hold_until=now + COALESCE_SECONDS
    )
    return outcome.as_dict()


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
    read = read if read is not None else rt.store.load(key)
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
        "tag_errors": effective.tag_errors,
    }
    try:
        audit_sk = rt.store.commit(
            key, read, written, audit, signals.now, event_key=event_key, close_incident=close, hold_until=hold_until
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
    logger.info("decision", extra={"audit": audit, "outcome": outcome.as_dict()})
    return outcome


def _next_stored(read: StoredState, decision: Decision) -> tuple[StoredState, str | None]:
    """The state to write, and the incident to close (if the job is no longer a problem)."""
    state = engine.next_state(read.state, decision)
    if decision.diagnosis in engine.NOT_PROBLEMS:
        return StoredState(state, read.version, None), read.incident
    incident = read.incident or f"incident#{decision.at:017.3f}"
    return StoredState(state, read.version, incident), None


def _act(
    signals: JobSignals,
    rt: Runtime,
    decision: Decision,
    written: StoredState,
    key: str,
    audit_sk: str,
    outcome: Outcome,
) -> None:
    """Stop first, then Slack; record both results. Never raises: the decision is committed (and its event claimed)
    already, so a raise would turn Lambda's retry into a duplicate and lose the action. A stop that fails or raises
    is released for the sweeper to retry; a message that rendered but was not delivered is kept for the sweeper to
    post again.

    The engine repeats no action (`JobState.alerted`, `warned_at`, `stopped_at`), so each one happens once."""
    if decision.action not in POSTED_ACTIONS:
        return
    job = signals.facts.name
    result: dict[str, Any] = {}
    stop_result = _stop(rt, signals, written, key) if decision.action is Action.STOP else None
    if stop_result is not None:
        outcome.stopped = stop_result.ok
        result["stop"] = {"ok": stop_result.ok, "detail": stop_result.detail}
    message: dict[str, Any] | None = None
    try:
        evidence = Evidence.of(decision, signals, written.state.stall_since)
        message = AlertMessage(decision, signals.facts, evidence, stop_result, written.incident).render()
        post = rt.notifier.post(message)
    except Exception as exc:  # a bug in rendering or posting: recorded like a failed post, never raised
        step = "post" if message is not None else "render"
        logger.exception("Slack message failed to render or post", extra={"job": job, "step": step})
        post = PostResult(ok=False, detail=f"{step}: {type(exc).__name__}: {exc}")
    outcome.posted = post.ok
    result["slack"] = {"ok": post.ok, "detail": post.detail}
    outcome.details.update(result)
    if not post.ok:
        metrics.add_metric(name=contract.SLACK_FAILURES, unit=MetricUnit.Count, value=1)
    try:
        if post.ok or message is None:  # delivered, or nothing rendered that could be posted again
            rt.store.record_outcome(key, audit_sk, result)
        else:
            logger.error("Slack post failed; the sweeper will post it again", extra={"job": job, "detail": post.detail})
            result["slack_attempts"] = [{"at": signals.now, "ok": False, "detail": post.detail}]
            rt.store.record_unsent_post(key, audit_sk, result, message, signals.now)
    except Exception:  # the actions happened; only their record in the audit trail is missing
        logger.exception("could not record the outcome", extra={"job": job, "audit": audit_sk, "outcome": result})


def _stop(rt: Runtime, signals: JobSignals, written: StoredState, key: str) -> actions.StopResult:
    """`actions.stop`, with any failure (returned or raised) counted, logged, and released for the sweeper to retry."""
    job = signals.facts.name
    try:
        stopped = actions.stop(rt.clients, signals.facts)
    except Exception as exc:  # actions.stop returns API errors; anything raised is a bug, treated as a failed stop
        logger.exception("stop raised; the sweeper will retry", extra={"job": job})
        stopped = actions.StopResult(ok=False, detail=f"{type(exc).__name__}: {exc}")
    metrics.add_metric(
        name=contract.JOBS_STOPPED if stopped.ok else contract.STOP_FAILURES, unit=MetricUnit.Count, value=1
    )
    if stopped.ok:
        return stopped
    logger.error("stop failed; the sweeper will retry", extra={"job": job, "detail": stopped.detail})
    try:
        # `written` carries the version read; the commit wrote the next one
        rt.store.release_stop(key, written.state, version=written.version + 1)
    except Exception:  # the stop stays recorded as done: an operator must stop the job
        logger.exception("could not release the failed stop: the sweeper will not retry it", extra={"job": job})
    return stopped
