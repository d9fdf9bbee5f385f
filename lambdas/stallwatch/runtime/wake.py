"""A fatal line wakes the engine: a CloudWatch Logs subscription delivers a job's fatal lines (and the agent's stall
record: its stack dumps, a minute into a stall), and the job is decided through the same engine and the same claim as
on_alarm's (`runtime.decide`), without waiting for an alarm. The engine alerts on a line alone; a stop (and any
recheck that stops, in this invocation or later) needs its second witness (docs/engine.md).

    handle_log_lines(parse_event(raw, LogLinesEvent), rt, time_left(context))

One delivery holds one log stream's events: its log group and stream name the job (its platform adapter's
`job_of_log_stream`: a SageMaker job's stream, an EC2 instance of a watched job). A delivery with no fatal line among
its events (the filter pattern is a superset of the regexes), of a stream no watched job writes, or a CONTROL_MESSAGE
(CloudWatch Logs checking the destination) changes nothing; so does a job the platform does not know or that has
ended (nothing is written to the table for it: it is read first, as an alarm's job is, unless this container found it
running a moment ago).

The decision begins when it sees the line (`core.wake.decision_start`: its timestamp, the time FilterLogEvents takes
to return it, on a 10-second grid), so every host's watchdog lines, delivered as many events in many invocations,
make one decision: a delivery whose line a decision beginning at or after that time sees is coalesced
(`JobStates.claim_wake`). A claim held by a decision that began before the line does not swallow it: the line's decision
takes it over, and decides again if the other one commits first. A recheck the engine asks for within
`WAIT_FOR_RECHECK_S` (a watchdog burst confirmed a minute later, a rank's death three) is decided in the same
invocation at its time, as its schedule would (`decide.handle_recheck`), where the function's time allows.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.events import DATA_MESSAGE, RECHECK_SOURCE, LogLinesEvent, RecheckEvent
from stallwatch.aws.job_states import StoredState
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core import contract, wake
from stallwatch.core.decision import Action
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.signals import JobFacts, Platform
from stallwatch.runtime import decide
from stallwatch.runtime.decide import COALESCE_SECONDS, Outcome
from stallwatch.runtime.environment import Runtime

TRIGGER_PREFIX = "log:"  # the audit's trigger: the log stream whose fatal line woke the decision
COMMIT_ATTEMPTS = 3  # a decision that began before the line may commit first: decide again on what it wrote


def handle_log_lines(event: LogLinesEvent, rt: Runtime, time_left_s: float) -> dict[str, Any]:
    """A subscription's delivery: decide on the job of its log stream if it holds a fatal line. `time_left_s`: the
    invocation's remaining time (it bounds the wait for a near recheck)."""
    deadline = rt.clock() + time_left_s
    data = event.awslogs.decoded_data
    if data.dropped_bytes:  # past the inflated bound: its events read whole before it are decided on
        logger.warning("a delivery past its bound was cut", extra={"dropped_bytes": data.dropped_bytes})
        metrics.add_metric(name=contract.SUBSCRIPTION_BYTES_DROPPED, unit=MetricUnit.Bytes, value=data.dropped_bytes)
    if data.messageType != DATA_MESSAGE:
        return _ignored(f"{data.messageType}: CloudWatch Logs checking the destination")
    patterns = rt.config.policy.log_lines.line_patterns()  # the deployment's: a job's tags are read, but wake nothing
    events = [e for e in data.logEvents if isinstance(e.message, str)]
    fatal = [e.timestamp.timestamp() for e in events if wake.wakes(e.message, patterns)]
    if not fatal:
        return _ignored(f"no fatal line nor stall record among {len(data.logEvents)} events")
    found = _job_of(rt, data.logGroup, data.logStream)
    if found is None:
        return _ignored(f"{data.logGroup} {data.logStream[:200]}: no watched job writes this stream")
    platform, job = found
    now = rt.clock()
    line_t = min(max(fatal), now)  # a host clock ahead of ours is read as now
    since, start = wake.seen_from(line_t), wake.decision_start(line_t, now)
    key = job_key(platform, job)
    if rt.states.line_seen(key, now, since, COALESCE_SECONDS):  # a burst's other deliveries: the job is not read
        return _coalesced(job)
    facts = None
    if not rt.found_running(platform, job, now):  # the job must exist, and run, before anything is written for it
        try:
            facts = rt.source(platform).facts(job)
        except JobNotFoundError as exc:
            return Outcome(job, "not_found", details={"reason": str(exc)}).as_dict()
        if facts.status.ended:
            return Outcome(job, "ended", details={"reason": f"job {facts.status}"}).as_dict()
        rt.saw_running(platform, job, now)
    read = rt.states.claim_wake(key, now, since, start, COALESCE_SECONDS)
    if read is None:  # a decision that sees the line took the claim, or was committed, since the look
        return _coalesced(job)
    if start > now:
        rt.sleep(start - now)
        read = rt.states.load(key)
    trigger = f"{TRIGGER_PREFIX}{data.logStream}"
    outcome = _decide(rt, platform, job, read, trigger, f"wake:{platform.value}:{job}@{start:.3f}", facts)
    if outcome.status == "decided" and outcome.action != Action.STOP.value:
        _decide_near_rechecks(rt, platform, job, deadline, outcome)
    return outcome.as_dict()


def time_left(context: Any) -> float:
    """The invocation's remaining seconds, from the Lambda context; none where it cannot say (no recheck is waited
    for)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() / 1000 if callable(remaining) else 0.0


def _job_of(rt: Runtime, group: str, stream: str) -> tuple[Platform, str] | None:
    """The watched job whose host writes `stream` in `group`, and its platform."""
    for platform in DESCRIPTIONS:
        job = rt.source(platform).job_of_log_stream(group, stream)
        if job is not None:
            return platform, job
    return None


def _decide(
    rt: Runtime,
    platform: Platform,
    job: str,
    read: StoredState,
    trigger: str,
    event_key: str,
    facts: JobFacts | None,
) -> Outcome:
    """One decision on a job this invocation holds the claim of. One that no longer exists or has ended gives the
    claim back and is left to its end event (nothing else is written)."""
    now = rt.clock()
    key = job_key(platform, job)
    try:
        signals = rt.source(platform).job_signals(job, now, facts=facts)
    except JobNotFoundError as exc:
        rt.states.release_claim(key)
        return Outcome(job, "not_found", details={"reason": str(exc)})
    if signals.facts.status.ended:
        rt.states.release_claim(key)
        return Outcome(job, "ended", details={"reason": f"job {signals.facts.status}"})
    outcome = Outcome(job, "duplicate")
    for _ in range(COMMIT_ATTEMPTS):
        hold_until = now + COALESCE_SECONDS
        outcome = decide.decide_and_act(signals, rt, trigger, event_key, read, hold_until=hold_until)
        if outcome.status != "duplicate":
            break
        read = rt.states.load(key)  # a decision that began before the line committed first: decide on its state
    return outcome


def _decide_near_rechecks(rt: Runtime, platform: Platform, job: str, deadline: float, outcome: Outcome) -> None:
    """Decide each recheck a decision asks for at its time, as its schedule would (which stays as the fallback and
    finds it decided), while one is due within `WAIT_FOR_RECHECK_S` and the invocation's time allows; until a stop."""
    decided: list[dict[str, Any]] = []
    while True:
        at = rt.states.load(job_key(platform, job)).state.recheck_at
        wait = wake.wait_for_recheck(at, rt.clock(), deadline)
        if at is None or wait is None:
            break
        rt.sleep(wait)
        result = decide.handle_recheck(RecheckEvent(source=RECHECK_SOURCE, platform=platform, job=job, at=at), rt)
        decided.append(result)
        if result["status"] != "decided" or result.get("action") == Action.STOP.value:
            break
    if decided:
        outcome.details["rechecks"] = decided


def _coalesced(job: str) -> dict[str, Any]:
    """A line a decision that sees it covers (it holds the claim, or was committed)."""
    metrics.add_metric(name=contract.COALESCED_LINES, unit=MetricUnit.Count, value=1)
    return Outcome(job, "coalesced", details={"reason": "a decision that sees the line holds the claim"}).as_dict()


def _ignored(reason: str) -> dict[str, Any]:
    return Outcome(job="", status="ignored", details={"reason": reason}).as_dict()
