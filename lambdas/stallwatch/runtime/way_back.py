"""Each platform's way back, behind the seam: a stop decision's attempt, within one budget, and the sweeper's steps.

    instead = instead_of_stop(rt, signals, decision, state, audit_sk)   # None: the plain stop
    reports = continue_ways_back(rt, now)                                # the sweeper: each way back's next step
    done, steps = attempts_so_far(rt, key, until)                        # the run's attempts, of every way back

The generic stop (`decide`) asks it before stopping a job: a job whose platform's way back replaces its stop or is it
(`PlatformDescription.way_back`: EC2's restart in place, Slurm's requeue) and that opted in (`stallwatch:recover`, one
grammar) gets the next attempt its run's budget allows (`core.way_back.plan`, resume's: attempts, and progress since
the last), from the platform's adapter (`PlatformAdapter.way_back`); a budget spent, or no progress since the last
attempt, stops the job as without it, and the stop's Slack message says why. It names no platform and no platform's
recovery module: the adapter holds its way back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.slack import follow_up
from stallwatch.aws.store import job_key
from stallwatch.core import contract
from stallwatch.core.decision import Action, Decision, JobState
from stallwatch.core.platforms import DESCRIPTIONS, describe
from stallwatch.core.platforms.interface import StopResult, WayBackAttempt
from stallwatch.core.resume import NoResume
from stallwatch.core.signals import JobSignals
from stallwatch.core.way_back import (
    IN_PLACE,
    TagError,
    WayBack,
    attempts,
    blamed_hosts,
    plan,
    recovers,
    stop_of_decision,
)
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.repost import SlackTeller

# What a way back taken does to the job, in the stop message's note when it is not taken.
TAKEN = {WayBack.RESTART: "recovered in place", WayBack.REQUEUE: "requeued"}


@dataclass(frozen=True)
class InsteadOfStop:
    """What a platform's way back makes of a stop decision: under way in place of the stop (`message`, posted in the
    stop message's place), the stop itself (`stop`: a requeue), or not taken (`note`: why, among the stop message's
    reasons; the job is stopped as without it). `audited`: the decision's outcome keeps it."""

    audited: dict[str, Any]
    message: dict[str, Any] | None = None
    stop: StopResult | None = None
    note: str | None = None

    @property
    def recovering(self) -> bool:
        return self.message is not None

    def reasons_of(self, decision: Decision) -> Decision:
        """The stop decision with the note among its reasons, for its Slack message."""
        return decision if self.note is None else replace(decision, reasons=(*decision.reasons, self.note))


def instead_of_stop(
    rt: Runtime, signals: JobSignals, decision: Decision, state: JobState, audit_sk: str
) -> InsteadOfStop | None:
    """For a stop decision of a job that opted in to its platform's way back in place: the platform's attempt (within
    the run's budget), or why not. None for a job that did not opt in, or whose platform has no such way back.
    `state`: the job's state as the decision wrote it; `audit_sk`: the decision's audit record. Never raises."""
    facts = signals.facts
    way = describe(facts.platform).way_back
    if decision.action is not Action.STOP or way not in IN_PLACE:
        return None
    try:
        if not recovers(facts.tags, way):
            return None
        attempt = _attempt(rt, signals, decision, state, audit_sk)
        result = rt.source(facts.platform).way_back(attempt, SlackTeller(rt))
    except TagError as exc:
        return _not_taken(way, {"status": "not_recovered", "reason": str(exc)}, str(exc))
    except Exception as exc:  # before anything is sent, a way back that cannot start leaves the stop to go ahead
        logger.exception("the way back could not start; stopping instead", extra={"job": facts.name})
        reason = f"{type(exc).__name__}: {exc}"
        return _not_taken(way, {"status": "not_recovered", "reason": reason}, reason)
    if result.reason is not None:
        return _not_taken(way, result.audited, result.reason)
    if result.text is not None:
        return InsteadOfStop(audited=result.audited, message=follow_up(result.text))
    return InsteadOfStop(audited=result.audited, stop=result.stop)


def _not_taken(way: WayBack, audited: dict[str, Any], reason: str) -> InsteadOfStop:
    return InsteadOfStop(audited=audited, note=f"not {TAKEN[way]}: {reason}")


def _attempt(rt: Runtime, signals: JobSignals, decision: Decision, state: JobState, audit_sk: str) -> WayBackAttempt:
    """The stop decision as the platform's next attempt: its place in the run's budget (or the budget's refusal), and
    the hosts a hardware signal blames."""
    facts = signals.facts
    stop = stop_of_decision(decision.at, decision.diagnosis.value, decision.evidence)
    done, steps = attempts_so_far(rt, job_key(facts.platform, facts.name), decision.at)
    budget = plan(facts.tags, stop, rt.config.policy.resume_max_restarts, done, max(steps, default=None))
    period = rt.config.policy.for_job(facts.tags).thresholds.alarm_period_seconds
    attempt, allowed = budget if not isinstance(budget, NoResume) else (done, done)
    return WayBackAttempt(
        facts=facts,
        decided_at=decision.at,
        decision_sk=audit_sk,
        stall_since=state.stall_since if state.stall_since is not None else decision.at,
        diagnosis=decision.diagnosis.value,
        reasons=decision.reasons,
        step=stop.step,
        stall_onset=stop.stall_onset,
        attempt=attempt,
        allowed=allowed,
        blamed=blamed_hosts(decision.evidence, signals.hosts, period, signals.now, facts.hardware_faults),
        refused=budget.reason if isinstance(budget, NoResume) else None,
    )


def attempts_so_far(rt: Runtime, key: str, until: float | None) -> tuple[int, list[float]]:
    """The run's ways back so far, whatever its platform's: its resumes (their claims) and its attempts in place
    (restarts, requeues: its audit trail), and the steps it had reached at its stops and attempts before `until`,
    for the one budget and its no-progress rule."""
    done, steps = attempts(rt.audit.records(key, "audit"), until)
    return rt.resume_tries.claims(key) + done, steps


def continue_ways_back(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """The next step of each way back under way, of every watched platform whose way back takes several (a restart in
    place); one platform's failure is logged and counted, never the sweep's."""
    reports = []
    teller = SlackTeller(rt)
    for platform in DESCRIPTIONS:
        if not rt.config.watches(platform):
            continue
        try:
            reports += rt.source(platform).continue_way_back(now, teller)
        except Exception:
            logger.exception("could not continue the ways back", extra={"platform": platform.value})
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
    return reports
