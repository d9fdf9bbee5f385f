"""Backtest: what Stallwatch would have done to a job, replayed from its trace on a simulated clock.

    result = replay(load_trace("corpus/traces/sm-hang-8host.jsonl"))
    result.first_stop_s, result.verdict  # 2940.0, Verdict.PASS

The replay walks the road the Lambdas walk, with the trace in place of AWS: the alarms `render_alarms`
gives the job run in the local `AlarmEvaluator` (evaluated every minute, every period for high-resolution
alarms); every sweeper tick publishes each host's ``LogIdleSeconds`` from log freshness; the engine decides on
every alarm transition to ALARM and, at sweeper ticks, while the job has an alarm in ALARM or an open
incident; `next_state` is kept between decisions; a STOP stops the replay's job.

Without a policy the replay enforces (stops need no opt-in tag); the trace's tags still apply on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stallwatch import contract, engine
from stallwatch.alarms import render_alarms
from stallwatch.config import StallwatchConfig
from stallwatch.decision import Action, Decision, JobState
from stallwatch.evaluator import AlarmEvaluator, AlarmState, metric_key
from stallwatch.policy import Mode, Policy
from stallwatch.trace import MetricEvent, StatusEvent, Trace
from stallwatch.trace_source import TraceSource

REPLAY_POLICY = Policy(mode=Mode.ENFORCE, stop_requires_tag=False)
CLOUDWATCH_EVALUATION_SECONDS = 60  # standard alarms are evaluated every minute
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped", "Stopping"})
SWEEPER = "sweeper"
# Decisions that reached a person (Slack) or the job.
NOTIFYING = frozenset({Action.ALERT, Action.WARN, Action.STOP})


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True)
class ReplayDecision:
    """One decision of the replay: when (trace seconds), what triggered it, and the engine's answer."""

    t: float
    trigger: str  # the alarm name, or "sweeper"
    decision: Decision

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "t": self.t,
            "trigger": self.trigger,
            "action": str(d.action),
            "would": str(d.would),
            "diagnosis": str(d.diagnosis),
            "reasons": list(d.reasons),
        }


@dataclass(frozen=True)
class ReplayResult:
    """What happened in one replay, and whether it matched the trace's label."""

    trace: str
    job: str
    mode: Mode
    decisions: tuple[ReplayDecision, ...]  # every decision whose action or `would` is not NONE
    decision_count: int  # every decide() call, NONE included
    diagnoses: tuple[str, ...]  # every diagnosis any decision reached, in order of first appearance
    alarm_transitions: int
    first_alert_s: float | None  # first Slack message: an alert or a warning
    first_warn_s: float | None
    first_stop_s: float | None
    verdict: Verdict | None  # None when the trace has no label
    verdict_reason: str = ""
    tag_errors: tuple[str, ...] = field(default_factory=tuple)
    expect: dict[str, Any] | None = None  # the trace's label, as written

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "job": self.job,
            "mode": str(self.mode),
            "first_alert_s": self.first_alert_s,
            "first_warn_s": self.first_warn_s,
            "first_stop_s": self.first_stop_s,
            "decisions": [d.to_json() for d in self.decisions],
            "diagnoses": list(self.diagnoses),
            "verdict": None if self.verdict is None else str(self.verdict),
            "verdict_reason": self.verdict_reason,
            "expect": self.expect,
        }


def _needs_decision(incident_open: bool, state: JobState, now: float) -> bool:
    """The sweeper's rule (watchdog): an open incident, a warning waiting to become a stop, or an expired snooze."""
    snooze_expired = state.snoozed_until is not None and state.snoozed_until <= now
    return incident_open or state.warned_at is not None or snooze_expired


def _first(decisions: list[ReplayDecision], actions: frozenset[Action]) -> float | None:
    return next((d.t for d in decisions if d.decision.action in actions), None)


def _judge(trace: Trace, diagnoses: list[str], first_stop: float | None) -> tuple[Verdict | None, str]:
    expect = trace.header.expect
    if expect is None:
        return None, "unlabeled"
    failures = []
    if expect.action == "none" and first_stop is not None:
        failures.append(f"expected no stop, stopped at {first_stop:g}s")
    if expect.action == "stop":
        lo, hi = expect.window_s or (0.0, math.inf)
        if first_stop is None:
            failures.append(f"expected a stop in [{lo:g}, {hi:g}]s, never stopped")
        elif not lo <= first_stop <= hi:
            failures.append(f"expected a stop in [{lo:g}, {hi:g}]s, stopped at {first_stop:g}s")
    if expect.diagnosis is not None and expect.diagnosis not in diagnoses:
        failures.append(f"expected diagnosis {expect.diagnosis!r}, saw {diagnoses or 'no decision'}")
    if failures:
        return Verdict.FAIL, "; ".join(failures)
    return Verdict.PASS, f"{expect.action}" + (f" in {list(expect.window_s)}" if expect.window_s else "")


def replay(trace: Trace, policy: Policy | None = None, config: StallwatchConfig | None = None) -> ReplayResult:
    """Replay `trace` under `policy` (default: enforce) with the sweeper cadence of `config`."""
    config = config or StallwatchConfig()
    source = TraceSource(trace)
    effective = (policy or REPLAY_POLICY).for_job(trace.job.tags)
    start = source.epoch(0)
    end = source.epoch(trace.duration_s)
    evaluator = AlarmEvaluator(render_alarms(source.facts(start), effective, config.alarm_prefix, []))
    tick = min(effective.thresholds.alarm_period_seconds, CLOUDWATCH_EVALUATION_SECONDS)
    sweep_every = config.sweeper_minutes * 60
    events = trace.events
    next_event = 0
    state = JobState()
    incident_open = False
    decisions: list[ReplayDecision] = []
    diagnoses: list[str] = []
    decision_count = transitions_count = 0

    def decide(now: float, trigger: str) -> Decision:
        nonlocal state, decision_count
        nonlocal incident_open
        decision = engine.decide(source.job_signals(source.job_name, now), effective, state, now)
        state = engine.next_state(state, decision)
        incident_open = decision.diagnosis not in engine.NOT_PROBLEMS
        decision_count += 1
        if decision.diagnosis.value not in diagnoses:
            diagnoses.append(decision.diagnosis.value)
        if decision.action is not Action.NONE or decision.would is not Action.NONE:
            decisions.append(ReplayDecision(now - start, trigger, decision))
        return decision

    now = math.ceil(start / tick) * tick
    stopped = finished = False
    while now <= end and not (stopped or finished):
        while next_event < len(events) and source.epoch(events[next_event].t) <= now:
            event = events[next_event]
            next_event += 1
            if isinstance(event, MetricEvent):
                m = event.metric
                evaluator.add_datapoint(metric_key(m.namespace, m.name, m.dimensions), source.epoch(event.t), m.value)
            elif isinstance(event, StatusEvent) and event.status in TERMINAL_STATUSES:
                finished = True
        if finished:
            break
        sweeping = now % sweep_every == 0
        if sweeping:
            for host in source.hosts:
                last = source.log_last_t(host, now)
                idle = now - (last if last is not None else start)
                key = metric_key(
                    contract.NAMESPACE,
                    contract.LOG_IDLE_SECONDS,
                    {contract.DIM_JOB: source.job_name, contract.DIM_HOST: host},
                )
                evaluator.add_datapoint(key, now, idle)
        transitions = evaluator.evaluate(now)
        transitions_count += len(transitions)
        decided = False
        for transition in transitions:
            if transition.new is AlarmState.ALARM and not stopped:
                decided = True
                stopped = decide(now, transition.alarm_name).action is Action.STOP
        if sweeping and not decided and not stopped and _needs_decision(incident_open, state, now):
            stopped = decide(now, SWEEPER).action is Action.STOP
        now += tick

    first_stop = _first(decisions, frozenset({Action.STOP}))
    verdict, reason = _judge(trace, diagnoses, first_stop)
    return ReplayResult(
        trace=trace.source,
        job=trace.job.name,
        mode=effective.mode,
        decisions=tuple(decisions),
        decision_count=decision_count,
        diagnoses=tuple(diagnoses),
        alarm_transitions=transitions_count,
        first_alert_s=_first(decisions, NOTIFYING),
        first_warn_s=_first(decisions, frozenset({Action.WARN})),
        first_stop_s=first_stop,
        verdict=verdict,
        verdict_reason=reason,
        tag_errors=tuple(effective.tag_errors),
        expect=None if trace.header.expect is None else trace.header.expect.model_dump(mode="json", exclude_none=True),
    )
