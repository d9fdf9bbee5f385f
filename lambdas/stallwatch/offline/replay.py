"""Backtest: what Stallwatch would have done to a job, replayed from its trace on a simulated clock.

    result = replay(load_trace("corpus/traces/sm-hang-8host-agent.jsonl"))
    result.first_stop_s, result.verdict  # 5200.0, Verdict.PASS

The replay walks the road the Lambdas walk, with the trace in place of AWS: the alarms `render_alarms`
gives the job run in the local `AlarmEvaluator` (evaluated every minute, every period for high-resolution
alarms); every sweeper tick publishes each host's ``LogIdleSeconds`` from log freshness (to the alarms, and to the
source, which reads its history back as AWS does); the engine decides on
every alarm transition to ALARM (one alarm-triggered decision each `ALARM_COALESCE_SECONDS`, as on_alarm's claim
coalesces an alarm burst; the sweeper decides a job whose alarm went to ALARM after its last decision), at the
recheck it asked for (`Decision.recheck_at`, scheduled as the runtime
schedules it: EventBridge Scheduler fires within the minute it is set to, the next whole minute), and, at sweeper
ticks, by the watchdog's rule (`engine.sweeper_due`: an open incident, a pending warning, an expired snooze, a
recheck that passed, a check-up); `next_state` is kept between decisions; a STOP stops the replay's job.

Without a policy the replay enforces (stops need no opt-in tag); the trace's tags still apply on top.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from stallwatch.core import contract, engine
from stallwatch.core.alarms import acts_on, parse_alarm_name, render_alarms
from stallwatch.core.config import ALARM_COALESCE_SECONDS, StallwatchConfig
from stallwatch.core.decision import Action, Decision, JobState
from stallwatch.core.evaluator import AlarmEvaluator, AlarmState, metric_key
from stallwatch.core.policy import Mode, Policy
from stallwatch.core.trace import Event, Trace, TraceHeader, scan_trace
from stallwatch.offline.trace_source import TraceSource

REPLAY_POLICY = Policy(mode=Mode.ENFORCE, stop_requires_tag=False)
CLOUDWATCH_EVALUATION_SECONDS = 60  # standard alarms are evaluated every minute
RECHECK = "recheck"
# EventBridge Scheduler invokes a one-time schedule within the minute it names (60-second precision); the runtime
# names the minute after the recheck time, and the replay fires it this far into that minute (half its precision).
SCHEDULER_MINUTE_S = 60
SCHEDULER_DELAY_S = 30.0
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
        } | ({"stacks": d.evidence["stacks"]} if "stacks" in d.evidence else {})


@dataclass(frozen=True)
class AlarmChange:
    """An alarm's move to `state` in the replay, at `t` (trace seconds)."""

    t: float
    alarm: str
    state: AlarmState


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
    alerts: int  # Slack alerts sent (Action.ALERT decisions)
    warnings: int  # stop warnings sent (Action.WARN decisions)
    verdict: Verdict | None  # None when the trace has no label
    verdict_reason: str = ""
    tag_errors: tuple[str, ...] = field(default_factory=tuple)
    expect: dict[str, Any] | None = None  # the trace's label, as written
    alarm_changes: tuple[AlarmChange, ...] = ()  # every alarm transition, in time order

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "job": self.job,
            "mode": str(self.mode),
            "first_alert_s": self.first_alert_s,
            "first_warn_s": self.first_warn_s,
            "first_stop_s": self.first_stop_s,
            "alerts": self.alerts,
            "warnings": self.warnings,
            "decisions": [d.to_json() for d in self.decisions],
            "diagnoses": list(self.diagnoses),
            "verdict": None if self.verdict is None else str(self.verdict),
            "verdict_reason": self.verdict_reason,
            "expect": self.expect,
        }


def _first(decisions: list[ReplayDecision], actions: frozenset[Action]) -> float | None:
    return next((d.t for d in decisions if d.decision.action in actions), None)


def _count(decisions: list[ReplayDecision], action: Action) -> int:
    return sum(1 for d in decisions if d.decision.action is action)


def _judge(
    header: TraceHeader, diagnoses: list[str], first_stop: float | None, sent: dict[str, int]
) -> tuple[Verdict | None, str]:
    expect = header.expect
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
    for kind, count in sent.items():
        allowed = expect.allowed(kind)
        if allowed is not None and count > allowed:
            failures.append(f"expected at most {allowed} {kind}, sent {count}")
    if failures:
        return Verdict.FAIL, "; ".join(failures)
    return Verdict.PASS, f"{expect.action}" + (f" in {list(expect.window_s)}" if expect.window_s else "")


class _Run:
    """One replay in progress: the simulated control plane's clock, alarms and memory of the job."""

    def __init__(self, source: TraceSource, policy: Policy, config: StallwatchConfig) -> None:
        self.source = source
        self.alarm_prefix = config.alarm_prefix
        self.effective = policy.for_job(source.job.tags)
        self.start = self.source.epoch(0)
        self.evaluator = AlarmEvaluator(
            render_alarms(self.source.facts(self.start), self.effective, config.alarm_prefix, [])
        )
        # The alarms read the trace's datapoints where the source keeps them: only periods ended by `now` count,
        # so they see what they would had each datapoint been handed to them at its time.
        for key, times, values in source.metric_points():
            self.evaluator.share_series(key, times, values)
        ended = [t for t, status in source.status_times() if status in TERMINAL_STATUSES]
        self.ended_at = ended[0] if ended else math.inf
        self.sweep_every = config.sweeper_minutes * 60
        self.checkup_every = config.checkup_minutes * 60
        self.last_decision_at: float | None = None
        self.claimed_until = -math.inf  # on_alarm's claim: alarms of the job until then are coalesced
        self.coalesced_at: float | None = None  # the newest alarm coalesced since the last decision
        self.state = JobState()
        self.incident_open = False
        self.decisions: list[ReplayDecision] = []
        self.diagnoses: list[str] = []
        self.decision_count = 0
        self.transitions: list[AlarmChange] = []

    def running(self, now: float) -> bool:
        """False once the job has ended (a terminal status at or before `now`)."""
        return self.ended_at > now

    def publish_log_idle(self, now: float) -> None:
        """The sweeper's `LogIdleSeconds`, for each host that has a log stream."""
        for host in self.source.hosts:
            last = self.source.log_last_t(host, now)
            if last is not None:
                dims = {contract.DIM_JOB: self.source.job_name, contract.DIM_HOST: host}
                self.evaluator.add_datapoint(
                    metric_key(contract.NAMESPACE, contract.LOG_IDLE_SECONDS, dims), now, now - last
                )
                self.source.publish_log_idle(host, now, now - last)

    def decide(self, now: float, trigger: str) -> bool:
        """One decision, as on_alarm or the sweeper makes it; True when it stops the job."""
        decision = engine.decide(self.source.job_signals(self.source.job_name, now), self.effective, self.state, now)
        self.state = engine.next_state(self.state, decision)
        self.incident_open = decision.diagnosis not in engine.NOT_PROBLEMS
        self.decision_count += 1
        self.last_decision_at = now
        if decision.diagnosis.value not in self.diagnoses:
            self.diagnoses.append(decision.diagnosis.value)
        if decision.action is not Action.NONE or decision.would is not Action.NONE:
            self.decisions.append(ReplayDecision(now - self.start, trigger, decision))
        return decision.action is Action.STOP

    def recheck_fires_at(self) -> float | None:
        """When the recheck the last decision asked for fires (None: none asked)."""
        at = self.state.recheck_at
        if at is None:
            return None
        return math.ceil(at / SCHEDULER_MINUTE_S) * SCHEDULER_MINUTE_S + SCHEDULER_DELAY_S

    def acts(self, name: str, state: AlarmState) -> bool:
        """Whether the alarm `name` entering `state` invokes on_alarm (`alarms.acts_on`)."""
        return acts_on(parse_alarm_name(name, self.alarm_prefix).kind, state.value)

    def alarmed(self, now: float, name: str) -> bool:
        """on_alarm for one alarm: True when it stops the job; an alarm of a job claimed by another is coalesced."""
        if now < self.claimed_until:
            self.coalesced_at = now
            return False
        self.claimed_until = now + ALARM_COALESCE_SECONDS
        return self.decide(now, name)

    def sweeper_due(self, now: float) -> bool:
        """The watchdog's rule (`engine.sweeper_due`), and an alarm coalesced after the last decision."""
        missed = self.coalesced_at is not None and (self.last_decision_at or -math.inf) < self.coalesced_at
        due = engine.sweeper_due(self.state, self.incident_open, self.last_decision_at, now, self.checkup_every)
        return due or missed

    def run(self) -> None:
        """Tick until the trace ends, the job ends, or the job is stopped."""
        tick = min(self.effective.thresholds.alarm_period_seconds, CLOUDWATCH_EVALUATION_SECONDS)
        end = self.source.epoch(self.source.last_t)
        now = math.ceil(self.start / tick) * tick
        while now <= end and self.running(now):
            fires = self.recheck_fires_at()
            while fires is not None and fires <= now and self.running(fires):
                if self.decide(fires, RECHECK):
                    return
                later = self.recheck_fires_at()
                fires = later if later is not None and later > fires else None
            sweeping = now % self.sweep_every == 0
            if sweeping:
                self.publish_log_idle(now)
            transitions = self.evaluator.evaluate(now)
            self.transitions += [AlarmChange(now - self.start, t.alarm_name, t.new) for t in transitions]
            alarmed = [t.alarm_name for t in transitions if self.acts(t.alarm_name, t.new)]
            for name in alarmed:  # one on_alarm invocation per alarm
                if self.alarmed(now, name):
                    return
            # a decision made this very minute already holds what the sweeper would see
            if sweeping and not alarmed and self.sweeper_due(now) and self.decide(now, SWEEPER):
                return
            now += tick


def replay(trace: Trace, policy: Policy | None = None, config: StallwatchConfig | None = None) -> ReplayResult:
    """Replay `trace` under `policy` (default: enforce everything) with the sweeper cadence of `config`."""
    return _replay(TraceSource(trace), policy, config)


def replay_file(path: str | Path, policy: Policy | None = None, config: StallwatchConfig | None = None) -> ReplayResult:
    """`replay` of a trace file, read one event at a time: the events are not kept (see `TraceSource.streamed`)."""
    with open(path, encoding="utf-8") as lines:
        header, events = scan_trace(lines, source=str(path))
        return replay_events(header, events, str(path), policy, config)


def replay_events(
    header: TraceHeader,
    events: Iterable[Event],
    name: str = "<trace>",
    policy: Policy | None = None,
    config: StallwatchConfig | None = None,
) -> ReplayResult:
    """`replay` of a trace given as its header and its events in time order, one at a time (a file being read, a
    simulator): only what the signals read is kept."""
    return _replay(TraceSource.streamed(header, events, name), policy, config)


def _replay(source: TraceSource, policy: Policy | None, config: StallwatchConfig | None) -> ReplayResult:
    run = _Run(source, policy or REPLAY_POLICY, config or StallwatchConfig())
    run.run()
    first_stop = _first(run.decisions, frozenset({Action.STOP}))
    sent = {"alerts": _count(run.decisions, Action.ALERT), "warnings": _count(run.decisions, Action.WARN)}
    verdict, reason = _judge(source.header, run.diagnoses, first_stop, sent)
    expect = source.header.expect
    return ReplayResult(
        trace=source.source_name,
        job=source.job_name,
        mode=run.effective.mode,
        decisions=tuple(run.decisions),
        decision_count=run.decision_count,
        diagnoses=tuple(run.diagnoses),
        alarm_transitions=len(run.transitions),
        first_alert_s=_first(run.decisions, NOTIFYING),
        first_warn_s=_first(run.decisions, frozenset({Action.WARN})),
        first_stop_s=first_stop,
        alerts=sent["alerts"],
        warnings=sent["warnings"],
        verdict=verdict,
        verdict_reason=reason,
        tag_errors=tuple(run.effective.tag_errors),
        expect=None if expect is None else expect.model_dump(mode="json", exclude_none=True),
        alarm_changes=tuple(run.transitions),
    )
