"""Stops that answer later: a platform whose stop is an SSM command (a Slurm job's scancel or requeue on its
controller) says only that it was sent; the sweeper reads each answer and finishes the stop.

    track(rt, key, audit_sk, facts, result, now)   # decide and the "Stop now" button: a stop with commands
    settle_stops(rt, now)                          # the sweeper: each answer read, recorded, posted

The answer goes on the decision's audit record (`stop.answer`; `stop.ok` as it went, for the resume and goodput
rules) and in the stop message's thread. A stop that failed (the command refused, timed out, or never answered) is
given back to the engine, whose next decision stops the job again; one the platform refused because the job is in
a state that is not a stall (a suspended Slurm job) is given back too, and the job is not stopped while it is so.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.pending_stops import PendingStop, PendingStops
from stallwatch.aws.slack import follow_up
from stallwatch.aws.source import JobNotFoundError
from stallwatch.core import contract
from stallwatch.core.platforms.interface import StopOutcome, StopResult
from stallwatch.core.signals import JobFacts
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.repost import post_safely

STOPS_PER_SWEEP = 25  # the oldest stops waiting for an answer; one ListCommandInvocations each


def track(rt: Runtime, key: str, audit_sk: str, facts: JobFacts, result: StopResult, now: float) -> None:
    """Keep a stop whose answer comes later (`result.commands`) for the sweeper; never raises (the stop is sent:
    without its answer read, the job's next decision is the safety net)."""
    if not result.ok or not result.commands:
        return
    stop = PendingStop(key, facts.platform, facts.name, audit_sk, result.commands, result.detail, now)
    try:
        PendingStops(rt.store).track(stop, now)
    except Exception:
        logger.exception("could not keep the stop for its answer", extra={"job": facts.name, "audit": audit_sk})


def settle_stops(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """Each pending stop's answer, oldest first: recorded and posted once it has come; one that fails to be read
    is logged and counted, and read again by the next sweep."""
    reports = []
    pending = PendingStops(rt.store)
    for stop in pending.oldest(STOPS_PER_SWEEP):
        try:
            reports.append(_settle(rt, pending, stop, now))
        except Exception as exc:
            logger.exception("could not read a stop's answer", extra={"job": stop.job, "commands": stop.commands})
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
            reports.append({"job": stop.job, "status": "error", "reason": f"{type(exc).__name__}: {exc}"})
    return reports


def _settle(rt: Runtime, pending: PendingStops, stop: PendingStop, now: float) -> dict[str, Any]:
    source = rt.source(stop.platform)
    sent = StopResult(ok=True, detail=stop.detail, commands=stop.commands)
    try:
        facts = source.facts(stop.job)
    except JobNotFoundError as exc:
        outcome: StopOutcome | None = StopOutcome(ok=True, detail=f"nothing to stop: {exc}")
    else:
        outcome = source.stop_outcome(facts, sent, stop.sent_at, now)
    if outcome is None:
        return {"job": stop.job, "status": "waiting", "since_s": round(now - stop.sent_at, 1)}
    answer = {"at": now, "ok": outcome.ok and not outcome.held, "detail": outcome.detail, "state": outcome.state}
    answer["held"] = outcome.held
    written = pending.settle(stop, answer)
    if written is None:
        return {"job": stop.job, "status": "settled_elsewhere"}
    if not answer["ok"]:
        _give_back(rt, stop)
    if not outcome.ok:  # a sent stop was counted when it was sent
        metrics.add_metric(name=contract.STOP_FAILURES, unit=MetricUnit.Count, value=1)
    thread = ((written.get("slack") or {}).get("ts")) or None
    post = post_safely(rt, follow_up(_text(stop.job, outcome), thread))
    if not post.ok:
        logger.error("the stop's answer was not posted", extra={"job": stop.job, "detail": post.detail})
    status = "held" if outcome.held else "stopped" if outcome.ok else "failed"
    return {"job": stop.job, "status": status, "detail": outcome.detail, "posted": post.ok}


def _give_back(rt: Runtime, stop: PendingStop) -> None:
    """The engine's stop no longer stands: its next decision may stop the job again (a failure), or will once the
    job runs and stalls again (a state that was not a stall)."""
    stored = rt.states.load(stop.job_key)
    if stored.state.stopped_at is None:
        return  # a newer decision, or the job's end, moved the state on already
    if not rt.states.release_stop(stop.job_key, stored.state, stored.version):
        logger.info("the engine's state moved on before the stop was given back", extra={"job": stop.job})


def _text(job: str, outcome: StopOutcome) -> str:
    if outcome.held:
        return f":pause_button: `{job}` was left alone: {outcome.detail}; it is watched again when it runs"
    if outcome.ok:
        return f":white_check_mark: `{job}`: {outcome.detail}"
    return f":x: `{job}`: the stop FAILED ({outcome.detail}); the next decision tries again"
