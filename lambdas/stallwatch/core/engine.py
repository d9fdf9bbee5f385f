"""The decision engine: is this job stalled, and what may Stallwatch do about it? Pure: no I/O, no clock.

    decision = decide(signals, policy.for_job(signals.facts.tags), state, now)
    ...  # the caller stops, alerts or audits per decision.action
    state = next_state(state, decision)

With the agent, progress decides (Steps, Step, LastStepAge) and utilization, power and logs corroborate.
Without it, or once its metrics vanish, host GPU utilization and log silence decide, as TII did.
What it measures in the signals (step interval, log silence, utilization runs, error lines) is in `measures`.
A lone signal waits its full threshold; independent signals that agree decide after `agreement_fraction` of it (the
evidence ladder, docs/engine.md). The job's cadence (step interval, longest log gap) is learned across decisions and
kept in `JobState`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from stallwatch.core import evidence, log_patterns, measures, stack_dumps
from stallwatch.core.decision import STALLS, Action, Cadence, Decision, Diagnosis, JobState, stall_onset
from stallwatch.core.measures import LEARNED_GAP_MARGIN
from stallwatch.core.platforms import describe
from stallwatch.core.policy import EffectivePolicy, Mode, Thresholds
from stallwatch.core.reading import host_period
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Series

RUNNING_STATUS = "InProgress"
UPLOADING_STATUS = "Uploading"
# SageMaker secondary statuses before training begins: never a stall.
STARTUP_STATUSES = frozenset(
    {
        "Starting",
        "Pending",
        "LaunchingMLInstances",
        "PreparingTrainingStack",
        "Downloading",
        "DownloadingTrainingImage",
        "Restarting",
        "Updating",
    }
)
SLOW_RATIO = 1.5  # current step interval over the earlier one above this is slow (a doubling is)
SLOW_SAMPLES = 3  # the current interval: the median of this many latest samples (one slow checkpoint step is not slow)
CRASH_STEP_INTERVALS = 2.0  # a crashed rank needs at least this many step intervals without a step
# Without the agent, busy GPUs and silent logs are one signal (busy GPUs are what training and a long evaluation look
# like), alerted at the log threshold; where GPU power holds its baseline (compute runs), stopped only after this many
# times it (without power: `Thresholds.busy_silence_minutes` and the job's own history).
BUSY_SILENCE_FACTOR = 4.0
# No progress a live job explains is never stopped before this many times the stall (without the agent, the
# log-silence) threshold: an undeclared checkpoint being written (its start line), the loop waiting for input
# (outside step(): a data stall, or a script idling after its work, which the wait must not hide for long).
CHECKPOINT_FACTOR = 4.0
DATA_WAIT_FACTOR = 2.0
CHECKPOINT_JOIN_INTERVALS = 2.0  # no agent: other hosts' lines may follow a checkpoint's start by this many cadences
# No step (without the agent: no log line) for more than this many periods: the job is stalling, and the decision
# names the times its later rungs turn decisive (no alarm fires again once the first has).
STALLING_PERIODS = 2
STARVED_WINDOWS = 3  # data starvation is seen in at least this many recent windows that completed steps
SUMMARY_HOSTS = 4  # hosts named in a reason; the evidence has them all
SAME_PROGRESS_S = 1.0  # two decisions' last progress this close is the same (read from different datapoints)
WOULD_STOP = "would_stop"  # `JobState.alerted` marker: observe/notify already recorded "enforce would stop now"
NOT_PROBLEMS = frozenset({Diagnosis.HEALTHY, Diagnosis.STARTING, Diagnosis.PHASE, Diagnosis.FINISHED})


@dataclass(frozen=True)
class _Finding:
    """A diagnosis with its reasons; `stoppable` when enforce would stop for it."""

    diagnosis: Diagnosis
    reasons: tuple[str, ...]
    stoppable: bool = False
    overdue: bool = False  # a benign state that has lasted suspiciously long (startup beyond its grace)
    conclusive: bool = False  # independent evidence agrees: the shorter `confirmed_grace_minutes` applies

    @property
    def problem(self) -> bool:
        return self.overdue or self.diagnosis not in NOT_PROBLEMS


def decide(signals: JobSignals, policy: EffectivePolicy, state: JobState, now: float) -> Decision:
    """Diagnose the job and choose the action its mode allows. Pure and deterministic."""
    facts = signals.facts
    found: dict[str, Any] = {"status": facts.status, "secondary_status": facts.secondary_status}
    if policy.tag_errors:
        found["tag_errors"] = list(policy.tag_errors)
    past_limit = facts.ends_by is not None and now >= facts.ends_by  # the platform ends it itself (Slurm's --time)
    if facts.status != RUNNING_STATUS or past_limit:
        reason = f"job is {facts.status}" if not past_limit else "past its time limit: the platform ends it"
        return Decision(
            job=facts.name,
            at=now,
            diagnosis=Diagnosis.FINISHED,
            action=Action.NONE,
            mode=policy.mode,
            reasons=(reason,),
            evidence=found | ({"ends_by": facts.ends_by} if past_limit else {}),
        )
    limits = measures.Limits.of(policy.thresholds, state.threshold_factor, measures.agent_window(signals.agent))
    deadlines = _Deadlines(now)
    finding, cadence = _diagnose(signals, policy.thresholds, limits, state, now, found, deadlines)
    if finding.stoppable:
        state = _resumed_warning(state, finding.diagnosis, found)
    if finding.diagnosis in STALLS:
        finding = _with_stacks(finding, signals, found, state)
    action, would, notes, stop_at = _act(finding, policy, state, now, limits)
    if finding.diagnosis is Diagnosis.STRAGGLER and found["straggler"]["host"] in state.stragglers:
        action, would = Action.NONE, Action.NONE  # a host is named once a run; the evidence still says it lags
    deadlines.add(stop_at)
    return Decision(
        job=facts.name,
        at=now,
        diagnosis=finding.diagnosis,
        action=action,
        mode=policy.mode,
        reasons=finding.reasons + notes,
        evidence=found,
        would=would,
        stoppable=finding.stoppable,
        cadence=cadence,
        recheck_at=deadlines.first(),
    )


def _with_stacks(finding: _Finding, signals: JobSignals, found: dict[str, Any], state: JobState) -> _Finding:
    """A stall's finding with where every rank is, from the agent's dumps since the last progress (`core.stack_dumps`):
    the odd rank out, or one line saying why no dump tells."""
    report = stack_dumps.explain(
        stack_dumps.latest(signals.stacks, stall_onset(found, state.stall_since)), signals.has_agent
    )
    found["stacks"] = report.evidence()
    return replace(finding, reasons=(*finding.reasons, report.summary))


def next_state(state: JobState, decision: Decision) -> JobState:
    """What to remember after acting on `decision`: the incident's start, warning, stop and alerts, the cadence
    learned so far (a log gap only ever grows: one the job came back from stays normal) and when to look again."""
    if decision.diagnosis is Diagnosis.FINISHED:
        return state
    learned = decision.cadence
    pauses = measures.Pauses(state.busy_pause_s, state.idle_pause_s).merged(
        measures.Pauses(learned.busy_pause_s, learned.idle_pause_s)
    )
    gaps = [g for g in (state.log_gap_s, learned.log_gap_s) if g is not None]
    state = state.with_(
        step_interval_s=learned.step_interval_s if learned.step_interval_s is not None else state.step_interval_s,
        log_gap_s=max(gaps, default=None),
        busy_pause_s=pauses.busy_s,
        idle_pause_s=pauses.idle_s,
        recheck_at=decision.recheck_at,
    )
    if decision.diagnosis is Diagnosis.STRAGGLER and decision.action is not Action.NONE:
        state = state.with_(stragglers=(*state.stragglers, decision.evidence["straggler"]["host"]))
    warning = _kept_warning(state, decision.evidence)
    if decision.diagnosis in (Diagnosis.HEALTHY, Diagnosis.PHASE):
        state = _learn_recovery(state, decision)
        return JobState(
            snoozed_until=state.snoozed_until,
            threshold_factor=state.threshold_factor,
            step_interval_s=state.step_interval_s,
            log_gap_s=state.log_gap_s,
            step_gap_s=state.step_gap_s,
            busy_pause_s=state.busy_pause_s,
            idle_pause_s=state.idle_pause_s,
            recheck_at=state.recheck_at,
            stragglers=state.stragglers,
            warning=warning,
        )
    alerted = state.alerted
    if decision.action is not Action.NONE:
        keys = [decision.diagnosis.value]
        if decision.would is Action.STOP:
            keys.append(WOULD_STOP)
        alerted += tuple(k for k in keys if k not in alerted)
    snoozed = state.snoozed_until is not None and state.snoozed_until > decision.at
    if not decision.stoppable:
        return state.with_(stall_since=None, stall_from=None, warned_at=None, alerted=alerted, warning=warning)
    state = _resumed_warning(state, decision.diagnosis, decision.evidence)
    warned_at = decision.at if decision.action is Action.WARN else state.warned_at
    if decision.action is Action.WARN:
        mark = _stall_mark(decision.evidence)
        warning = None if mark is None else (decision.diagnosis.value, mark, decision.at)
    return state.with_(
        stall_since=state.stall_since if state.stall_since is not None else decision.at,
        stall_from=state.stall_from if state.stall_since is not None else _last_progress(decision),
        # A snooze voids an earlier warning: when it ends, a fresh warning comes before any stop.
        warned_at=None if snoozed else warned_at,
        warning=None if snoozed else warning,
        alerted=alerted,
        stopped_at=decision.at if decision.action is Action.STOP else state.stopped_at,
    )


def _last_progress(decision: Decision) -> float | None:
    """The last progress a decision saw: the agent's last step while it reports, else the newest log line."""
    agent = decision.evidence.get("agent", {})
    if agent.get("fresh") and agent.get("last_step_t") is not None:
        return agent["last_step_t"]
    return decision.evidence.get("logs", {}).get("last_t")


def _stall_mark(evidence: dict[str, Any]) -> float | None:
    """What marks one stall: the agent's last step (known once its metrics stopped too), else the newest log line.
    A decision that sees a later one saw progress."""
    last_step = evidence.get("agent", {}).get("last_step_t")
    return last_step if last_step is not None else evidence.get("logs", {}).get("last_t")


def _kept_warning(state: JobState, evidence: dict[str, Any]) -> tuple[str, float, float] | None:
    """The incident's warning, while the decision saw no progress since it."""
    mark = _stall_mark(evidence)
    if state.warning is None or mark is None or abs(mark - state.warning[1]) > SAME_PROGRESS_S:
        return None
    return state.warning


def _resumed_warning(state: JobState, diagnosis: Diagnosis, evidence: dict[str, Any]) -> JobState:
    """A warning withdrawn by a decision that lost sight of its evidence (a metric late, a tail cut short) and the
    same diagnosis found again with no progress since: the warning stands, and its grace runs on."""
    warning = _kept_warning(state, evidence)
    if state.warned_at is not None or warning is None or warning[0] != diagnosis.value:
        return state
    return state.with_(warned_at=warning[2], stall_from=state.stall_from or warning[1])


def _learn_recovery(state: JobState, decision: Decision) -> JobState:
    """A warned stall the job came back from was normal for it: remember its length (at most the time from the last
    progress before it to this decision), so the same stall is not warned again. Steps with the agent, logs without."""
    if state.warned_at is None or state.stall_from is None or decision.diagnosis is not Diagnosis.HEALTHY:
        return state
    gap = decision.at - state.stall_from
    if decision.evidence.get("agent", {}).get("fresh"):
        return state.with_(step_gap_s=max(gap, state.step_gap_s or 0.0))
    return state.with_(log_gap_s=max(gap, state.log_gap_s or 0.0))


def sweeper_due(
    state: JobState, incident_open: bool, last_decision_at: float | None, now: float, checkup_s: float
) -> bool:
    """The watchdog's rule for deciding a job without an alarm: an open incident, a warning waiting to become a stop,
    a snooze that has run out, a recheck the engine asked for (a lone signal reaching its full threshold, which no
    alarm announces), or a check-up once the last decision is `checkup_s` old (stragglers and slowdowns raise no
    alarm; 0: never)."""
    snooze_expired = state.snoozed_until is not None and state.snoozed_until <= now
    recheck = state.recheck_at is not None and state.recheck_at <= now
    checkup = checkup_s > 0 and last_decision_at is not None and now - last_decision_at >= checkup_s
    return incident_open or state.warned_at is not None or snooze_expired or recheck or checkup


# --- diagnosis ---------------------------------------------------------------------------------------------------


class _Deadlines:
    """The times at which a rule turns decisive if nothing changes; the decision asks to be made again at the first
    one still ahead (`Decision.recheck_at`)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.times: list[float] = []

    def add(self, t: float | None) -> None:
        if t is not None and t > self.now:
            self.times.append(t)

    def first(self) -> float | None:
        return min(self.times, default=None)


@dataclass(frozen=True)
class _Context:
    """What every rule of one decision reads."""

    signals: JobSignals
    thresholds: Thresholds
    limits: measures.Limits
    now: float
    evidence: dict[str, Any]
    deadlines: _Deadlines
    training_since: float
    logs: measures.Logs
    period: float  # the hosts' datapoints' period (or the agent's window, if longer)
    pauses: measures.Pauses  # the longest healthy pauses the job came back from, learned so far


def _diagnose(
    signals: JobSignals,
    thresholds: Thresholds,
    limits: measures.Limits,
    state: JobState,
    now: float,
    found: dict[str, Any],
    deadlines: _Deadlines,
) -> tuple[_Finding, Cadence]:
    """The finding, and the job's cadence as learned so far (this decision's measurements, else the state's)."""
    facts = signals.facts
    training_since = measures.training_since(signals)
    found["training_s"] = round(now - training_since, 1)
    remembered = Cadence(
        step_interval_s=state.step_interval_s,
        log_gap_s=state.log_gap_s,
        busy_pause_s=state.busy_pause_s,
        idle_pause_s=state.idle_pause_s,
    )
    if facts.secondary_status in STARTUP_STATUSES:
        deadlines.add(facts.start_time + limits.startup_s)
        return _startup(facts.secondary_status, now - facts.start_time, limits), remembered
    if facts.secondary_status == UPLOADING_STATUS:
        return _Finding(Diagnosis.HEALTHY, ("uploading model artifacts after training",)), remembered
    logs = measures.log_silence(signals, training_since, thresholds, limits, now, state.log_gap_s)
    found["logs"] = {
        "last_t": logs.last_t,
        "silence_s": round(logs.silence_s, 1),
        "interval_s": measures.rounded(logs.interval_s),
        "learned_gap_s": measures.rounded(logs.learned_gap_s),
        "threshold_s": round(logs.threshold_s, 1),
    }
    has_progress = any(len(signals.agent.get(name, Series())) for name in measures.PROGRESS_METRICS)
    progress = (
        measures.progress(signals.agent, thresholds, limits, now, state.step_interval_s, state.step_gap_s)
        if has_progress
        else None
    )
    interval = progress.interval_s if progress is not None else state.step_interval_s  # progress falls back to it too
    series = describe(signals.facts.platform).host_series_read
    period = max(
        float(host_period(len(signals.hosts), thresholds.alarm_period_seconds, series)),
        measures.agent_window(signals.agent) or 0.0,
    )
    pauses = measures.Pauses(state.busy_pause_s, state.idle_pause_s).merged(
        measures.pauses(signals, thresholds, period)
    )
    cadence = Cadence(interval, logs.learned_gap_s, pauses.busy_s, pauses.idle_s)
    ctx = _Context(signals, thresholds, limits, now, found, deadlines, training_since, logs, period, pauses)
    return _diagnose_running(ctx, progress), cadence


def _diagnose_running(ctx: _Context, progress: measures.Progress | None) -> _Finding:
    """Conclusive evidence first, whatever the agent says of phases; then the agent's progress, else the hosts'
    GPUs and logs."""
    # The last progress: the agent's last step (known even once its metrics stopped: the host that reported them may
    # be the one that died), else the newest log line.
    last_step_t = None if progress is None else (progress.last_step_t or ctx.training_since)
    if last_step_t is not None:
        since = last_step_t
    else:
        since = ctx.logs.last_t if ctx.logs.last_t is not None else ctx.training_since
    host_limits = ctx.limits.for_hosts(ctx.period)
    hosts = evidence.read_hosts(ctx.signals, since, ctx.thresholds, host_limits, ctx.now)
    ctx.evidence["hosts"] = {
        name: measures.host_evidence(host, since, ctx.thresholds, host_limits, ctx.now) | _life_signs(hosts[name])
        for name, host in ctx.signals.hosts.items()
    }
    if progress is not None:
        ctx.evidence["agent"] = {
            "last_step_t": progress.last_step_t,
            "step": progress.step,
            "step_age_s": None if progress.last_step_t is None else round(ctx.now - progress.last_step_t, 1),
            "step_interval_s": measures.rounded(progress.interval_s),
            "stall_threshold_s": round(progress.stall_s, 1),
            "newest_t": progress.newest_t,
            "fresh": progress.fresh,
        }
    conclusive = _conclusive(ctx, hosts, last_step_t)
    if conclusive is not None:
        return conclusive
    if progress is None:
        return _without_agent(ctx, hosts, ())
    phase = _phase(ctx, progress)
    if phase is not None:
        return phase
    if progress.fresh:
        return _with_agent(ctx, hosts, progress)
    vanished = (f"agent metrics stopped {_min(ctx.now - progress.newest_t)} ago; deciding from host metrics and logs",)
    return _without_agent(ctx, hosts, vanished)


def _life_signs(host: evidence.Host) -> dict[str, Any]:
    """A host's life signs in the decision's evidence."""
    return {
        "gpu_memory_now": host.memory_now,
        "memory_released_t": host.released_since,
        "newest_data_t": host.newest_data_t,
        "checkpoint_since_t": host.checkpoint_since,
    }


def _conclusive(ctx: _Context, hosts: dict[str, evidence.Host], last_step_t: float | None) -> _Finding | None:
    """Evidence of death (a rank's fatal last words with its GPUs dead, NCCL timeouts everywhere, a vanished host,
    one host's GPUs let go of) decides once `crash_confirm_minutes` passed with no progress since: a dead process
    finishes no step, so no step interval, however long, delays it. Every process gone without a fatal line is
    idleness: it waits the agreement rung of `idle_minutes`, and the full grace."""
    deaths = evidence.death(
        hosts,
        last_step_t,
        ctx.training_since,
        ctx.thresholds,
        ctx.limits,
        ctx.period,
        ctx.now,
    )
    decisive = [d for d in deaths if ctx.now >= d.onset + d.confirm_s]
    if not decisive:
        for death in deaths:
            ctx.deadlines.add(death.onset + death.confirm_s)
        for h in hosts.values():  # last words whose GPUs are not seen dead yet: look when their death would confirm
            if h.last_words_t is not None:
                ctx.deadlines.add(h.last_words_t + ctx.limits.crash_s)
        return None
    found = decisive[0]
    confirm = found.confirm_s
    ctx.evidence["death"] = {"kind": found.diagnosis.value, "onset_t": found.onset, "hosts": list(found.hosts)}
    reasons = list(found.reasons)
    if found.lines:
        reasons.append(_error_summary(found.lines))
    reasons.append(f"no progress for {_min(ctx.now - found.onset)} since (confirm {_min(confirm)})")
    reasons.append(_utilization_summary(_with_gpus(ctx.evidence["hosts"], ctx.signals.facts)))
    return _Finding(found.diagnosis, tuple(reasons), stoppable=True, conclusive=found.conclusive)


def _intervals_s(ctx: _Context, progress: measures.Progress | None) -> float:
    """`CRASH_STEP_INTERVALS` step intervals: no evidence decides before a slow step could have ended."""
    interval = progress.interval_s if progress is not None else None
    return CRASH_STEP_INTERVALS * (interval or 0.0) * ctx.limits.factor


def _startup(secondary: str, elapsed_s: float, limits: measures.Limits) -> _Finding:
    if elapsed_s <= limits.startup_s:
        return _Finding(Diagnosis.STARTING, (f"{secondary} for {_min(elapsed_s)} (grace {_min(limits.startup_s)})",))
    reason = f"still {secondary} after {_min(elapsed_s)}, beyond the {_min(limits.startup_s)} startup grace"
    return _Finding(Diagnosis.STARTING, (reason, "startup is never stopped; check the data download"), overdue=True)


def _phase(ctx: _Context, progress: measures.Progress) -> _Finding | None:
    """A declared phase (PhaseBudgetRemaining > 0) with no step since: within budget, or overrunning it.

    The agent reports 0 both once a phase ends and once it outruns its budget, so a 0 seen before the budget could
    have run out is the phase's end. After the budget, the phase may have ended at any moment: the overrun is
    decisive only past both the allowance and the job's learned step gap (a step is due that long after the end)."""
    points = ctx.signals.agent.get("PhaseBudgetRemaining", Series()).points
    last = next((i for i in range(len(points) - 1, -1, -1) if points[i][1] > 0), None)
    if last is None:
        return None
    t, remaining = points[last]
    deadline = t + remaining
    if progress.last_step_t is not None and progress.last_step_t > t:
        return None  # steps resumed after the phase
    if last + 1 < len(points) and _ended_before(points[last], points[last + 1], deadline):
        return None  # the phase ended within its budget: the step rules judge the gap
    now, allowance = ctx.now, max(ctx.limits.overrun_s, progress.learned_s)
    ctx.evidence["phase"] = {"deadline_t": deadline, "overrun_s": round(max(0.0, now - deadline), 1)}
    ctx.deadlines.add(deadline + allowance)  # the budget's end changes nothing but the words: its allowance's does
    if now <= deadline:
        return _Finding(Diagnosis.PHASE, (f"in a declared phase with {_min(deadline - now)} of its budget left",))
    overrun = now - deadline
    if overrun <= allowance:
        return _Finding(
            Diagnosis.PHASE,
            (f"declared phase past its budget by {_min(overrun)}, within the {_min(allowance)} allowance",),
        )
    if not progress.fresh:
        return None  # the agent vanished: no proof that steps did not resume
    return _Finding(
        Diagnosis.PHASE_OVERRUN,
        (
            f"declared phase overran its budget by {_min(overrun)} (allowance {_min(allowance)})",
            "no step completed since the phase began",
        ),
        stoppable=True,
    )


def _ended_before(active: tuple[float, float], after: tuple[float, float], deadline: float) -> bool:
    """Whether the 0 at `after` (a period's aggregate, as `active` is) covers only moments before `deadline`."""
    return after[0] + (after[0] - active[0]) <= deadline


def _with_agent(ctx: _Context, hosts: dict[str, evidence.Host], progress: measures.Progress) -> _Finding:
    """Progress decides; utilization, power and error lines explain. The evidence ladder: no step alone waits the full
    stall threshold; with GPU activity fallen on every host it decides after `agreement_fraction` of it; a collective
    spinning on every host (no step, GPUs busy, power fallen) or a rank's fatal last words after `crash_confirm`."""
    thresholds, limits, now, ev = ctx.thresholds, ctx.limits, ctx.now, ctx.evidence
    if progress.last_step_t is None:
        ctx.deadlines.add(ctx.training_since + limits.startup_s)
        if now - ctx.training_since <= limits.startup_s:
            return _Finding(
                Diagnosis.STARTING,
                (f"no step yet, {_min(now - ctx.training_since)} into training (grace {_min(limits.startup_s)})",),
            )
        since = ctx.training_since
        no_step = f"no step at all in {_min(now - since)} of training"
    else:
        since = progress.last_step_t
        no_step = f"no completed step for {_min(now - since)} (last step {_fmt(progress.step)})"
    threshold = f"threshold {_min(progress.stall_s)}"
    if progress.interval_s is not None:
        threshold += f" from a {_dur(progress.interval_s)} step interval"
    confirm_s = min(max(limits.crash_s, _intervals_s(ctx, progress)), progress.stall_s)
    # A rank's fatal last words after the last step, its GPUs not (yet) seen dead: the line and the missing steps
    # agree after `crash_confirm`.
    errors = {name: list(h.last_words) for name, h in hosts.items() if (h.last_words_t or -math.inf) >= since}
    if errors:
        first_error_t = min(lines[0].t for lines in errors.values())
        ctx.deadlines.add(first_error_t + confirm_s)
        if now - first_error_t >= confirm_s:
            age = f"{no_step}; the first error is {_min(now - first_error_t)} old (confirm {_min(confirm_s)})"
            return _error_finding(errors, (age, _utilization_summary(ev["hosts"])))
    gpu_hosts = _with_gpus(ev["hosts"], ctx.signals.facts)
    stalling = now - since >= STALLING_PERIODS * ctx.period  # steps stopped: no alarm announces the later rungs
    logs_active = ev["logs"]["silence_s"] < ev["logs"]["threshold_s"]
    # Three signals agree, but the stalls a job came back from (and its step interval) still count.
    spin_s = max(confirm_s, progress.learned_s)
    if progress.last_step_t is not None and evidence.spinning(hosts, thresholds):
        if stalling:
            ctx.deadlines.add(since + spin_s)
        if now - since >= spin_s:
            lines = measures.errors_since(ctx.signals.hosts, since)
            reasons = (
                *([_error_summary(lines)] if lines else []),
                f"{no_step}: a collective spins on every host (GPUs busy, power fallen), confirm {_min(spin_s)}",
                _utilization_summary(gpu_hosts),
                *filter(None, [_power_summary(gpu_hosts)]),
                *(["logs are still active, but the agent reports no steps"] if logs_active else []),
            )
            return _Finding(Diagnosis.HANG, reasons, stoppable=True, conclusive=True)
    early_s = max(thresholds.agreement_fraction * progress.stall_s, confirm_s)
    fallen = _gpus_fallen(gpu_hosts, thresholds)
    stall_s = early_s if fallen else progress.stall_s
    if stalling:
        ctx.deadlines.add(since + stall_s)
    if now - since > stall_s:
        all_idle = bool(gpu_hosts) and all(
            h["gpu_util_now"] is not None and h["gpu_util_now"] < thresholds.idle_gpu_percent
            for h in gpu_hosts.values()
        )
        power = _power_summary(gpu_hosts)
        power_dropped = any(h["power_dropped"] for h in gpu_hosts.values())
        if power and not (all_idle or power_dropped):
            # GPUs still draw their working power: compute runs (a step far longer than before), not a hang.
            return _Finding(
                Diagnosis.SLOW,
                (f"{no_step}, {threshold}", f"but GPU power holds: {power}", "not stopping while the GPUs compute"),
            )
        if progress.last_step_t is None and not (all_idle or not logs_active):
            # Never a step, yet the GPUs work and the logs flow: more likely agent.step() is not called.
            return _Finding(
                Diagnosis.STARTING,
                (f"{no_step}, yet GPUs are busy and logs active", "is agent.step() called? not stopping for this"),
                overdue=True,
            )
        benign = _benign_wait(ctx, hosts, since, progress.stall_s)
        if benign is not None:
            return benign
        if fallen:
            threshold = f"{threshold}, {_min(stall_s)} as GPU activity fell on every host too"
        reasons = [f"{no_step}, {threshold}", _utilization_summary(gpu_hosts)]
        if power:
            reasons.append(power)
        if logs_active:
            reasons.append("logs are still active, but the agent reports no steps")
        return _Finding(Diagnosis.IDLE if all_idle else Diagnosis.HANG, tuple(reasons), stoppable=True)
    return _progressing(ctx, progress)


def _benign_wait(
    ctx: _Context,
    hosts: dict[str, evidence.Host],
    since: float,
    threshold_s: float,
    slack_s: float = evidence.LAST_WORDS_S,
) -> _Finding | None:
    """No progress, explained by something a live job does: a checkpoint being written (its start line at most
    `slack_s` before the last progress, nothing since on its host) or just written (its end line less than the
    threshold ago), with the agent the loop waiting outside step() for input, or a pause like the ones the job came
    back from (idle GPUs, memory held: a checkpoint whose lines no pattern reads). Never stopped before
    `CHECKPOINT_FACTOR` (`DATA_WAIT_FACTOR`) x the threshold, or LEARNED_GAP_MARGIN x that pause, from the last
    progress; then it is a stall like any other."""
    now = ctx.now
    checkpoint = evidence.checkpoint_since(hosts, since, slack_s)
    ended = evidence.checkpoint_ended(hosts, since)
    if checkpoint is None and ended is not None and now - ended < threshold_s:
        # A checkpoint's end line is life: the first step after it is due within the threshold, reported at the
        # agent's next window.
        ctx.deadlines.add(ended + threshold_s)
        ctx.evidence["checkpoint"] = {"ended_t": ended}
        what = f"a checkpoint ended {_min(now - ended)} ago (its end line): steps are due"
        return _Finding(Diagnosis.PHASE, (f"no progress for {_min(now - since)}, {what}",))
    wait = ctx.signals.agent.get("DataWaitFraction", Series()).since(since).mean()
    waiting = wait is not None and wait > ctx.thresholds.data_wait_percent
    paused = _as_paused_before(ctx, hosts)
    if checkpoint is None and not waiting and not paused:
        return None
    if checkpoint is not None:
        ctx.evidence["checkpoint"] = {"since_t": checkpoint}
        what = f"writing a checkpoint for {_min(now - checkpoint)} (its start line, nothing since)"
        limit, diagnosis, overrun = CHECKPOINT_FACTOR * threshold_s, Diagnosis.PHASE, Diagnosis.PHASE_OVERRUN
    elif waiting:
        ctx.evidence["data_wait_percent"] = round(wait or 0.0, 1)
        what = f"waiting for input {wait:.0f}% of the time since the last step"
        limit, diagnosis, overrun = DATA_WAIT_FACTOR * threshold_s, Diagnosis.DATA_STARVATION, Diagnosis.IDLE
    else:
        what = f"paused with idle GPUs and memory held, as it came back from a {_min(ctx.pauses.idle_s or 0.0)} pause"
        limit, diagnosis, overrun = 0.0, Diagnosis.PHASE, Diagnosis.IDLE
    limit = max(limit, paused)
    ctx.deadlines.add(since + limit)
    if now - since < limit:
        return _Finding(
            diagnosis, (f"no progress for {_min(now - since)}, {what}", f"not stopping before {_min(limit)}")
        )
    return _Finding(overrun, (f"no progress for {_min(now - since)}, {what}: past {_min(limit)}",), stoppable=True)


def _as_paused_before(ctx: _Context, hosts: dict[str, evidence.Host]) -> float:
    """How long the job may pause with idle GPUs and memory held: LEARNED_GAP_MARGIN x the longest such pause it
    came back from (its own checkpoints, whatever their lines say), if every GPU host holds its memory now; else 0."""
    learned = ctx.pauses.idle_s
    gpu_hosts = [h for h in hosts.values() if h.gpus]
    held = bool(gpu_hosts) and all(
        h.memory_now is not None and h.memory_now >= ctx.thresholds.idle_gpu_percent for h in gpu_hosts
    )
    if learned is None or not held:
        return 0.0
    return LEARNED_GAP_MARGIN * learned * ctx.limits.factor


def _with_gpus(hosts: dict[str, Any], facts: JobFacts) -> dict[str, Any]:
    """The hosts whose GPUs speak for the job: a heterogeneous cluster's CPU-only hosts have no GPU metrics, and only
    their logs count."""
    return {name: host for name, host in hosts.items() if facts.gpus_on(name)}


def _gpus_fallen(hosts: dict[str, dict], thresholds: Thresholds) -> bool:
    """Every host's GPUs fell silent: power below `power_drop_ratio` x its baseline, or utilization idle."""
    return bool(hosts) and all(
        h["power_dropped"] or (h["gpu_util_now"] is not None and h["gpu_util_now"] < thresholds.idle_gpu_percent)
        for h in hosts.values()
    )


def _progressing(ctx: _Context, progress: measures.Progress) -> _Finding:
    """A job that makes progress: healthy, or one of the problems that are never a stall."""
    agent, thresholds, now, evidence_ = ctx.signals.agent, ctx.thresholds, ctx.now, ctx.evidence
    recent_since = now - ctx.limits.recent_s
    nonfinite = sum(agent.get("NonFiniteLoss", Series()).since(recent_since).values())
    if nonfinite > 0:
        reason = f"{nonfinite:g} non-finite losses in the last {_min(ctx.limits.recent_s)}"
        return _Finding(Diagnosis.NONFINITE_LOSS, (reason,), stoppable=thresholds.stop_on_nonfinite_loss)
    data_wait = _stepping_data_wait(agent, recent_since)
    if data_wait is not None and data_wait > thresholds.data_wait_percent:
        evidence_["data_wait_percent"] = round(data_wait, 1)
        reason = f"waiting for input {data_wait:.0f}% of the time (threshold {thresholds.data_wait_percent:g}%)"
        return _Finding(Diagnosis.DATA_STARVATION, (reason, "still progressing: never stopped for this"))
    hosts, facts, limits, period = ctx.signals.hosts, ctx.signals.facts, ctx.limits, ctx.period
    lagging, due = measures.straggler(hosts, facts, thresholds, limits, now, period)
    ctx.deadlines.add(due)  # a host lagging for less than the window yet is named when its window fills
    if lagging is not None:
        evidence_["straggler"] = lagging
        summary = _straggler_summary(lagging, measures.straggler_window(limits, period))
        return _Finding(Diagnosis.STRAGGLER, (summary, "still progressing: never stopped for this"))
    values = [v for _, v in measures.interval_samples(agent)]
    if len(values) > SLOW_SAMPLES:
        current = statistics.median(values[-SLOW_SAMPLES:])
        earlier = statistics.median(values[:-SLOW_SAMPLES])  # the pace over the lookback
        evidence_["step_interval_current_s"] = round(current, 3)
        evidence_["step_interval_earlier_s"] = round(earlier, 3)
        if current > SLOW_RATIO * earlier:
            return _Finding(
                Diagnosis.SLOW,
                (
                    f"steps take {_dur(current)}, {current / earlier:.1f}x the earlier {_dur(earlier)}",
                    "still progressing: never stopped for this",
                ),
            )
    age = "no step yet" if progress.last_step_t is None else f"last step {_min(now - progress.last_step_t)} ago"
    return _Finding(Diagnosis.HEALTHY, (f"progressing: {age} (stall threshold {_min(progress.stall_s)})",))


def _stepping_data_wait(agent: dict[str, Series], since: float) -> float | None:
    """The mean DataWaitFraction of the recent windows in which steps completed (at least `STARVED_WINDOWS`): a
    pause (an undeclared checkpoint, an evaluation) is all waiting to the agent, and no starvation."""
    stepped = {t for t, v in agent.get("Steps", Series()).since(since).points if v > 0}
    waits = [v for t, v in agent.get("DataWaitFraction", Series()).since(since).points if t in stepped]
    return statistics.mean(waits) if len(waits) >= STARVED_WINDOWS else None


def _without_agent(ctx: _Context, hosts: dict[str, evidence.Host], notes: tuple[str, ...]) -> _Finding:
    """Host GPU utilization and log silence decide; every host must show the same picture."""
    signals, thresholds, limits, now, logs = ctx.signals, ctx.thresholds, ctx.limits, ctx.now, ctx.logs
    gpu_hosts = list(_with_gpus(signals.hosts, signals.facts).values())
    utils = [measures.gpu_util(h) for h in gpu_hosts]
    never_active = all(all(v < thresholds.idle_gpu_percent for v in u.values()) for u in utils)
    if never_active and now - ctx.training_since <= limits.startup_s:
        ctx.deadlines.add(ctx.training_since + limits.startup_s)
        return _Finding(
            Diagnosis.STARTING,
            (*notes, f"GPUs not active yet, {_min(now - ctx.training_since)} in (grace {_min(limits.startup_s)})"),
        )
    silence = "logs silent" if logs.last_t is not None else "no log line from any host"
    log_reason = f"{silence} for {_min(logs.silence_s)} (threshold {_min(logs.threshold_s)})"
    # A rank's fatal last words, its GPUs not seen dead (no GPU data, or a CPU-only host): its silence confirms them,
    # against its own cadence but never longer than the job's base log threshold (a learned gap never delays it).
    crashed: dict[str, list[LogLine]] = {}
    silences: list[str] = []
    for h in signals.hosts.values():
        words = hosts[h.host].last_words
        if not words or h.log_last_t is None:
            continue
        needed = measures.crash_silence_s(h, thresholds, limits, limits.log_floor_s)
        ctx.deadlines.add(h.log_last_t + needed)
        if now - h.log_last_t >= needed:
            crashed[h.host] = list(words)
            silences.append(f"{h.host} silent for {_min(now - h.log_last_t)} after it (threshold {_min(needed)})")
    if crashed:
        return _error_finding(crashed, (*notes, *silences))
    last = logs.last_t if logs.last_t is not None else ctx.training_since
    silent = logs.silence_s >= STALLING_PERIODS * ctx.period  # no alarm announces the later rungs of a silence
    if logs.last_t is not None and evidence.spinning(hosts, thresholds):
        if silent:
            ctx.deadlines.add(last + limits.crash_s)
        if now - last >= limits.crash_s:
            hosts_ev = _with_gpus(ctx.evidence["hosts"], signals.facts)
            reasons = (
                *notes,
                f"a collective spins on every host (GPUs busy, power fallen) and {log_reason}",
                *filter(None, [_power_summary(hosts_ev)]),
            )
            return _Finding(Diagnosis.HANG, reasons, stoppable=True, conclusive=True)
    # Busy GPUs are what training looks like: only logs that were seen and then fell silent make them a hang.
    # (No log line at all means the logs are unknown, e.g. an EC2 host whose logs are not shipped.)
    complete = len(gpu_hosts) >= max(signals.facts.gpu_host_count(), 1)
    stale_s = limits.for_hosts(ctx.period).stale_s
    busy = [measures.trailing_run(u, lambda v: v >= thresholds.busy_gpu_percent, now, stale_s) for u in utils]
    hung = silent and logs.last_t is not None and complete and all(d is not None and d >= limits.idle_s for d in busy)
    stop_s, why = _busy_silence_s(ctx, hosts) if hung else (math.inf, ())
    # Idle GPUs and silent logs are two signals: when both agree they decide after `agreement_fraction` of their
    # thresholds. Neither alone ever stops a job without the agent.
    agree = thresholds.agreement_fraction
    if silent:
        ctx.deadlines.add(last + agree * logs.threshold_s)
    if logs.silence_s >= agree * logs.threshold_s:
        idle = [measures.trailing_run(u, lambda v: v < thresholds.idle_gpu_percent, now, stale_s) for u in utils]
        if silent and complete and all(d is not None for d in idle):
            ctx.deadlines.add(now + agree * limits.idle_s - min(d for d in idle if d is not None))
        if complete and all(d is not None and d >= agree * limits.idle_s for d in idle):
            # The other hosts' lines may follow its start line for a log interval or two, until they join it.
            slack = max(evidence.LAST_WORDS_S, CHECKPOINT_JOIN_INTERVALS * (logs.interval_s or 0.0))
            benign = _benign_wait(ctx, hosts, last, logs.threshold_s, slack)
            if benign is not None:
                return replace(benign, reasons=(*notes, *benign.reasons))
            reason = f"GPUs below {thresholds.idle_gpu_percent:g}% on all {_hosts(gpu_hosts)} for {_min(min(idle))}"
            ladder = f"idle GPUs and silent logs agree: each decides after {agree:.2g} of its threshold"
            return _Finding(Diagnosis.IDLE, (*notes, reason, log_reason, ladder), stoppable=True)
    if logs.silence_s < min(logs.threshold_s, stop_s):
        if logs.silence_s >= agree * logs.threshold_s or hung:
            ctx.deadlines.add(last + min(logs.threshold_s, stop_s))
        return _Finding(Diagnosis.HEALTHY, (*notes, f"within the log-silence threshold: {log_reason}"))
    if not hung:
        return _Finding(
            Diagnosis.HEALTHY, (*notes, log_reason, "but GPU utilization does not show a consistent idle or hung job")
        )
    # Busy GPUs and silent logs: a hang, or an evaluation that logs nothing. Alerted at the log threshold, stopped
    # once the silence outlasts what the job's own history allows (`_busy_silence_s`).
    reason = f"GPUs at or above {thresholds.busy_gpu_percent:g}% on all {_hosts(gpu_hosts)} for {_min(min(busy))}"
    ctx.deadlines.add(last + stop_s)
    if logs.silence_s >= stop_s:
        return _Finding(Diagnosis.HANG, (*notes, reason, log_reason, *why), stoppable=True)
    lone = f"busy GPUs with silent logs may be a long evaluation: not stopping before {_min(stop_s)} of silence"
    return _Finding(Diagnosis.HANG, (*notes, reason, log_reason, lone, *why))


def _busy_silence_s(ctx: _Context, hosts: dict[str, evidence.Host]) -> tuple[float, tuple[str, ...]]:
    """How long busy GPUs and silent logs may last before they are stopped as a hang, and why.

    GPU power that holds its baseline says compute runs (a long evaluation): BUSY_SILENCE_FACTOR x the log threshold.
    Without power (SageMaker without the agent, EC2 without the CloudWatch agent's power_draw) nothing tells a
    collective spinning from an evaluation but time: `busy_silence_minutes`, and a rare logger's line was due that
    much later (its interval beyond a period), or LEARNED_GAP_MARGIN x the longest silence with busy GPUs the job
    came back from (its own evaluations), if longer."""
    limits, learned = ctx.limits, ctx.pauses.busy_s
    if any(h.reports_power for h in hosts.values() if h.gpus):
        return BUSY_SILENCE_FACTOR * ctx.logs.threshold_s, ("GPU power holds: compute runs, as in an evaluation",)
    interval = measures.log_interval(ctx.signals.hosts.values(), ctx.training_since) or 0.0
    overdue = max(0.0, interval - ctx.period)
    stop_s = max(limits.busy_silence_s + overdue, LEARNED_GAP_MARGIN * (learned or 0.0) * limits.factor)
    ctx.evidence["busy_silence"] = {
        "stop_s": round(stop_s, 1),
        "log_interval_s": measures.rounded(interval),
        "learned_busy_pause_s": measures.rounded(learned),
    }
    history = (
        f"the longest silence with busy GPUs it came back from is {_min(learned)}"
        if learned is not None
        else "it was never silent that long with busy GPUs"
    )
    power = (
        f"no GPU power reported: with it (the agent, or the CloudWatch agent's power_draw on EC2) a hung collective "
        f"would be decided {_min(limits.crash_s)} after its last progress"
    )
    return stop_s, (history, power)


def _error_finding(errors: dict[str, list[LogLine]], reasons: tuple[str, ...]) -> _Finding:
    """Fatal lines after progress stopped: a crashed rank, or a hang when all are NCCL collective timeouts."""
    patterns = {measures.fatal(line) for lines in errors.values() for line in lines}
    diagnosis = Diagnosis.HANG if patterns == {log_patterns.NCCL_TIMEOUT} else Diagnosis.CRASHED_RANK
    return _Finding(diagnosis, (_error_summary(errors), *reasons), stoppable=True)


# --- reasons -----------------------------------------------------------------------------------------------------


def _error_summary(errors: dict[str, list[LogLine]]) -> str:
    parts = [
        f"{name}: {', '.join(sorted({measures.fatal(line) or '' for line in lines}))}" for name, lines in errors.items()
    ]
    return "fatal error lines on " + "; ".join(sorted(parts))


def _utilization_summary(hosts: dict[str, dict]) -> str:
    parts = [f"{name} {_pct(h['gpu_util_before'])} -> {_pct(h['gpu_util_now'])}" for name, h in sorted(hosts.items())]
    return "GPU utilization before -> now: " + (_first_hosts(parts) if parts else "no host metrics")


def _straggler_summary(lagging: dict[str, Any], window_s: float) -> str:
    """Which host straggles, by how much, and every host's value (the spread a team cordons a node on)."""
    metric, host, values = lagging["metric"], lagging["host"], lagging["values"]
    unit, side = ("s", "slower") if metric == "StepTime" else ("W", "lower")
    spread = ", ".join(f"{h} {v:g} {unit}" for h, v in values.items())
    return (
        f"straggler {host}: {metric} {values[host]:g} {unit} against a median of {lagging['others_median']:g} {unit} "
        f"on the other {len(values) - 1} hosts ({lagging['ratio']:g}x {side}) for {_min(window_s)}; "
        f"per host: {spread}"
    )


def _power_summary(hosts: dict[str, dict]) -> str | None:
    known = {name: h for name, h in hosts.items() if h["power_w_baseline"] is not None and h["power_w_now"] is not None}
    if not known:
        return None
    dropped = sum(h["power_dropped"] for h in known.values())
    parts = [  # in W, or in % of the device's maximum (a NeuronCore's)
        f"{n} {h['power_w_baseline']:.0f} {h['power_unit']} -> {h['power_w_now']:.0f} {h['power_unit']}"
        for n, h in sorted(known.items())
    ]
    return f"GPU power dropped on {dropped}/{len(known)} hosts: {_first_hosts(parts)}"


def _first_hosts(parts: list[str]) -> str:
    """The first few hosts' details; the evidence has them all."""
    more = [f"+{len(parts) - SUMMARY_HOSTS} more"] if len(parts) > SUMMARY_HOSTS else []
    return ", ".join(parts[:SUMMARY_HOSTS] + more)


def _hosts(hosts: list[HostSignals]) -> str:
    return "1 host" if len(hosts) == 1 else f"{len(hosts)} hosts"


def _dur(seconds: float) -> str:
    """Seconds for step-sized durations, minutes beyond two."""
    return f"{seconds:.3g} s" if seconds < 120 else _min(seconds)


def _min(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"


# --- mode --------------------------------------------------------------------------------------------------------


def _act(
    finding: _Finding, policy: EffectivePolicy, state: JobState, now: float, limits: measures.Limits
) -> tuple[Action, Action, tuple[str, ...], float | None]:
    """(action, would, notes, stop_at): what the mode allows, what enforce would do, why, and when a warned stall
    becomes a stop (the grace: `confirmed_grace_minutes` after conclusive evidence, else `stop_grace_minutes`)."""
    if policy.mode is Mode.OFF or not finding.problem:
        return Action.NONE, Action.NONE, (), None
    grace = limits.confirmed_grace_s if finding.conclusive else limits.grace_s
    snoozed = state.snoozed_until is not None and state.snoozed_until > now
    snooze_note = (f"snoozed until {state.snoozed_until:.0f}",) if snoozed else ()
    until = state.snoozed_until if snoozed else None
    repeat = finding.diagnosis.value in state.alerted
    if policy.mode is Mode.ENFORCE:
        if not finding.stoppable:
            base = Action.AUDIT if snoozed else Action.ALERT
            return (Action.NONE if repeat else base), Action.NONE, snooze_note, until
        if state.stopped_at is not None:
            return Action.NONE, Action.NONE, (f"stop already requested at {state.stopped_at:.0f}",), None
        if snoozed:
            return (Action.NONE if repeat else Action.AUDIT), Action.NONE, snooze_note, until
        if not policy.may_stop:
            note = "not stopping: the job is not tagged stallwatch:mode=enforce"
            return (Action.NONE if repeat else Action.ALERT), Action.NONE, (note,), None
        if state.warned_at is None:
            note = f"will stop in {_min(grace)} unless it recovers or is snoozed"
            return Action.WARN, Action.NONE, (note,), now + grace
        stop_at = state.warned_at + grace
        if now >= stop_at:
            return Action.STOP, Action.NONE, (f"warned {_min(now - state.warned_at)} ago and still stalled",), None
        return Action.NONE, Action.NONE, (f"warned; stopping in {_min(stop_at - now)}",), stop_at
    would, stop_at = Action.ALERT, None
    if finding.stoppable:
        stop_at = None if state.stall_since is None else state.stall_since + grace
        would = Action.STOP if stop_at is not None and now >= stop_at else Action.WARN
        if stop_at is None:
            stop_at = now + grace
    key = WOULD_STOP if would is Action.STOP else finding.diagnosis.value
    base = Action.AUDIT if policy.mode is Mode.OBSERVE or snoozed else Action.ALERT
    return (Action.NONE if key in state.alerted else base), would, snooze_note, until or stop_at
