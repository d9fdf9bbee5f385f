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
schedules it: EventBridge Scheduler fires within the minute it is set to, the next whole minute), at a fatal line
the subscription filter delivers (`core.wake`: `DELIVERY_DELAY_S` after the line, a decision beginning when it sees
it, one for a burst, and the recheck it asks for within `WAIT_FOR_RECHECK_S` decided in the same invocation), and,
at sweeper ticks, by the watchdog's rule (`engine.sweeper_due`: an open incident, a pending warning, an expired
snooze, a recheck that passed, a check-up); `next_state` is kept between decisions; a STOP stops the replay's job.

Without a policy the replay enforces (stops need no opt-in tag); the trace's tags still apply on top.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from stallwatch.core import contract, engine, wake
from stallwatch.core.alarms import acts_on, parse_alarm_name, render_alarms
from stallwatch.core.config import ALARM_COALESCE_SECONDS, ON_LOG_LINE_TIMEOUT_SECONDS, StallwatchConfig
from stallwatch.core.decision import NOT_PROBLEMS, Action, Decision, JobState
from stallwatch.core.evaluator import AlarmEvaluator, AlarmState, metric_key
from stallwatch.core.policy import Mode, Policy
from stallwatch.core.signals import LogLine
from stallwatch.core.trace import Event, Trace, TraceHeader, scan_trace
from stallwatch.offline.trace_source import TraceSource

REPLAY_POLICY = Policy(mode=Mode.ENFORCE, stop_requires_tag=False)
CLOUDWATCH_EVALUATION_SECONDS = 60  # standard alarms are evaluated every minute
RECHECK = "recheck"
# EventBridge Scheduler invokes a one-time schedule within the minute it names (60-second precision); the runtime
# names the minute after the recheck time, and the replay fires it this far into that minute (half its precision).
SCHEDULER_MINUTE_S = 60
SCHEDULER_DELAY_S = 30.0
SWEEPER = "sweeper"
WAKE_PREFIX = "log:"  # a wake-up's trigger: the stream of the fatal line that woke it
# Decisions that reached a person (Slack) or the job.
NOTIFYING = frozenset({Action.ALERT, Action.WARN, Action.STOP})


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True)
class ReplayDecision:
    """One decision of the replay: when (trace seconds), what triggered it, and the engine's answer."""

    t: float
    trigger: str  # the alarm name, "recheck", "sweeper", or "log:<stream>" (a fatal line's wake-up)
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
    wake_ups: int = 0  # decisions a fatal line woke (the rechecks they waited for not counted)

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
            "wake_ups": self.wake_ups,
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


@dataclass(frozen=True, order=True)
class _Wake:
    """A wake-up's decision pending in on_log_line, or a recheck its invocation waits for (`trigger` RECHECK)."""

    start: float  # when it begins reading
    trigger: str
    since: float  # a decision that began at or after this time makes it unnecessary
    deadline: float  # the invocation's end


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
        ended = [t for t, status in source.status_times() if status.winding_down]
        self.ended_at = ended[0] if ended else math.inf
        self.sweep_every = config.sweeper_minutes * 60
        self.checkup_every = config.checkup_minutes * 60
        self.last_decision_at: float | None = None
        self.claimed_until = -math.inf  # on_alarm's claim: alarms of the job until then are coalesced
        self.decided_from = -math.inf  # when the newest decision (any trigger) began reading
        # The fatal lines the subscription delivers, in time order, and the wake-ups they started.
        subscribed = config.subscribes(source.job.platform)  # a replayed job's platform is one the deployment watches
        filter_pattern, patterns = policy.fatal_filter_pattern, policy.log_lines.line_patterns()
        self.fatal_lines = [
            line for line in source.log_lines() if subscribed and wake.delivered(line.message, filter_pattern, patterns)
        ]
        self.delivered = 0
        self.wakes: list[_Wake] = []  # pending
        self.recheck_fired: float | None = None  # the newest recheck fired (each fires once)
        self.coalesced_at: float | None = None  # the newest alarm coalesced since the last decision
        self.state = JobState()
        self.incident_open = False
        self.decisions: list[ReplayDecision] = []
        self.diagnoses: list[str] = []
        self.decision_count = 0
        self.transitions: list[AlarmChange] = []
        self.wake_ups = 0

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
        self.incident_open = decision.diagnosis not in NOT_PROBLEMS
        self.decision_count += 1
        self.last_decision_at = now
        self.decided_from = max(self.decided_from, now)
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

    def arrive(self, line: LogLine) -> None:
        """on_log_line for one fatal line, `DELIVERY_DELAY_S` after it: a wake-up that begins when it sees the line,
        unless a decision begins (or began) then or later (`JobStates.claim_wake`)."""
        since = wake.seen_from(line.t)
        if self.decided_from >= since or any(w.start >= since for w in self.wakes):
            return
        arrival = line.t + wake.DELIVERY_DELAY_S
        start = wake.decision_start(line.t, arrival)
        self.wakes.append(_Wake(start, f"{WAKE_PREFIX}{line.stream}", since, arrival + ON_LOG_LINE_TIMEOUT_SECONDS))
        self.claimed_until = max(self.claimed_until, start + ALARM_COALESCE_SECONDS)

    def woken(self, woken: _Wake) -> bool:
        """A wake-up's decision, or a recheck its invocation waits for (skipped if a decision began at or after its
        time); True when it stops the job. The invocation waits for the next recheck its decision asks for within
        `WAIT_FOR_RECHECK_S`, while its time allows (`wake.wait_for_recheck`)."""
        if woken.trigger == RECHECK:
            if self.decided_from >= woken.since:
                return False
            if self.decide(woken.start, RECHECK):
                return True
        else:
            self.claimed_until = max(self.claimed_until, woken.start + ALARM_COALESCE_SECONDS)
            self.wake_ups += 1
            if self.decide(woken.start, woken.trigger):
                return True
        at = self.state.recheck_at
        wait = wake.wait_for_recheck(at, woken.start, woken.deadline)
        if at is not None and wait is not None:
            self.wakes.append(_Wake(woken.start + wait, RECHECK, at, woken.deadline))
        return False

    def catch_up(self, now: float) -> bool:
        """The rechecks, fatal lines delivered and wake-ups due by `now`, in time order; True when one stops the
        job."""
        while True:
            due: list[tuple[float, int]] = []
            fires = self.recheck_fires_at()
            if fires is not None and fires != self.recheck_fired:
                due.append((fires, 0))
            if self.delivered < len(self.fatal_lines):
                due.append((self.fatal_lines[self.delivered].t + wake.DELIVERY_DELAY_S, 1))
            if self.wakes:
                due.append((min(self.wakes).start, 2))
            due = [d for d in due if d[0] <= now]
            if not due:
                return False
            t, kind = min(due)
            if not self.running(t):
                return False
            if kind == 0:
                self.recheck_fired = fires
                if self.decide(t, RECHECK):
                    return True
            elif kind == 1:
                self.arrive(self.fatal_lines[self.delivered])
                self.delivered += 1
            else:
                woken = min(self.wakes)
                self.wakes.remove(woken)
                if self.woken(woken):
                    return True

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
            if self.catch_up(now):
                return
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
        wake_ups=run.wake_ups,
    )
