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

import statistics
from dataclasses import dataclass, replace
from typing import Any

from stallwatch.core import log_patterns, measures
from stallwatch.core.decision import Action, Cadence, Decision, Diagnosis, JobState
from stallwatch.core.policy import EffectivePolicy, Mode, Thresholds
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
# like): alerted at the log threshold, stopped only after this many times it.
BUSY_SILENCE_FACTOR = 4.0
SUMMARY_HOSTS = 4  # hosts named in a reason; the evidence has them all
WOULD_STOP = "would_stop"  # `JobState.alerted` marker: observe/notify already recorded "enforce would stop now"
NOT_PROBLEMS = frozenset({Diagnosis.HEALTHY, Diagnosis.STARTING, Diagnosis.PHASE, Diagnosis.FINISHED})


@dataclass(frozen=True)
class _Finding:
    """A diagnosis with its reasons; `stoppable` when enforce would stop for it."""

    diagnosis: Diagnosis
    reasons: tuple[str, ...]
    stoppable: bool = False
    overdue: bool = False  # a benign state that has lasted suspiciously long (startup beyond its grace)
    recheck_at: float | None = None  # a lone signal reaches its full threshold then

    @property
    def problem(self) -> bool:
        return self.overdue or self.diagnosis not in NOT_PROBLEMS


def decide(signals: JobSignals, policy: EffectivePolicy, state: JobState, now: float) -> Decision:
    """Diagnose the job and choose the action its mode allows. Pure and deterministic."""
    facts = signals.facts
    evidence: dict[str, Any] = {"status": facts.status, "secondary_status": facts.secondary_status}
    if policy.tag_errors:
        evidence["tag_errors"] = list(policy.tag_errors)
    if facts.status != RUNNING_STATUS:
        return Decision(
            job=facts.name,
            at=now,
            diagnosis=Diagnosis.FINISHED,
            action=Action.NONE,
            mode=policy.mode,
            reasons=(f"job is {facts.status}",),
            evidence=evidence,
        )
    limits = measures.Limits.of(policy.thresholds, state.threshold_factor, measures.agent_window(signals.agent))
    finding, cadence = _diagnose(signals, policy.thresholds, limits, state, now, evidence)
    action, would, notes = _act(finding, policy, state, now, limits)
    return Decision(
        job=facts.name,
        at=now,
        diagnosis=finding.diagnosis,
        action=action,
        mode=policy.mode,
        reasons=finding.reasons + notes,
        evidence=evidence,
        would=would,
        stoppable=finding.stoppable,
        cadence=cadence,
        recheck_at=finding.recheck_at,
    )


def next_state(state: JobState, decision: Decision) -> JobState:
    """What to remember after acting on `decision`: the incident's start, warning, stop and alerts, the cadence
    learned so far (a log gap only ever grows: one the job came back from stays normal) and when to look again."""
    if decision.diagnosis is Diagnosis.FINISHED:
        return state
    learned = decision.cadence
    gaps = [g for g in (state.log_gap_s, learned.log_gap_s) if g is not None]
    state = state.with_(
        step_interval_s=learned.step_interval_s if learned.step_interval_s is not None else state.step_interval_s,
        log_gap_s=max(gaps, default=None),
        recheck_at=decision.recheck_at,
    )
    if decision.diagnosis in (Diagnosis.HEALTHY, Diagnosis.PHASE):
        state = _learn_recovery(state, decision)
        return JobState(
            snoozed_until=state.snoozed_until,
            threshold_factor=state.threshold_factor,
            step_interval_s=state.step_interval_s,
            log_gap_s=state.log_gap_s,
            step_gap_s=state.step_gap_s,
            recheck_at=state.recheck_at,
        )
    alerted = state.alerted
    if decision.action is not Action.NONE:
        keys = [decision.diagnosis.value]
        if decision.would is Action.STOP:
            keys.append(WOULD_STOP)
        alerted += tuple(k for k in keys if k not in alerted)
    snoozed = state.snoozed_until is not None and state.snoozed_until > decision.at
    if not decision.stoppable:
        return state.with_(stall_since=None, stall_from=None, warned_at=None, alerted=alerted)
    warned_at = decision.at if decision.action is Action.WARN else state.warned_at
    return state.with_(
        stall_since=state.stall_since if state.stall_since is not None else decision.at,
        stall_from=state.stall_from if state.stall_since is not None else _last_progress(decision),
        # A snooze voids an earlier warning: when it ends, a fresh warning comes before any stop.
        warned_at=None if snoozed else warned_at,
        alerted=alerted,
        stopped_at=decision.at if decision.action is Action.STOP else state.stopped_at,
    )


def _last_progress(decision: Decision) -> float | None:
    """The last progress a decision saw: the agent's last step while it reports, else the newest log line."""
    agent = decision.evidence.get("agent", {})
    if agent.get("fresh") and agent.get("last_step_t") is not None:
        return agent["last_step_t"]
    return decision.evidence.get("logs", {}).get("last_t")


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


def _diagnose(
    signals: JobSignals,
    thresholds: Thresholds,
    limits: measures.Limits,
    state: JobState,
    now: float,
    evidence: dict[str, Any],
) -> tuple[_Finding, Cadence]:
    """The finding, and the job's cadence as learned so far (this decision's measurements, else the state's)."""
    facts = signals.facts
    training_since = measures.training_since(signals)
    evidence["training_s"] = round(now - training_since, 1)
    remembered = Cadence(step_interval_s=state.step_interval_s, log_gap_s=state.log_gap_s)
    if facts.secondary_status in STARTUP_STATUSES:
        return _startup(facts.secondary_status, now - facts.start_time, limits), remembered
    if facts.secondary_status == UPLOADING_STATUS:
        return _Finding(Diagnosis.HEALTHY, ("uploading model artifacts after training",)), remembered
    logs = measures.log_silence(signals, training_since, thresholds, limits, now, state.log_gap_s)
    evidence["logs"] = {
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
    cadence = Cadence(step_interval_s=interval, log_gap_s=logs.learned_gap_s)
    return _diagnose_running(signals, training_since, logs, progress, thresholds, limits, now, evidence), cadence


def _diagnose_running(
    signals: JobSignals,
    training_since: float,
    logs: measures.Logs,
    progress: measures.Progress | None,
    thresholds: Thresholds,
    limits: measures.Limits,
    now: float,
    evidence: dict[str, Any],
) -> _Finding:
    if progress is not None and progress.fresh:
        since = progress.last_step_t if progress.last_step_t is not None else training_since
    else:
        since = logs.last_t if logs.last_t is not None else training_since
    evidence["hosts"] = {
        name: measures.host_evidence(host, since, thresholds, limits, now) for name, host in signals.hosts.items()
    }
    if progress is None:
        return _without_agent(signals, training_since, logs, thresholds, limits, now, ())
    evidence["agent"] = {
        "last_step_t": progress.last_step_t,
        "step": progress.step,
        "step_age_s": None if progress.last_step_t is None else round(now - progress.last_step_t, 1),
        "step_interval_s": measures.rounded(progress.interval_s),
        "stall_threshold_s": round(progress.stall_s, 1),
        "newest_t": progress.newest_t,
        "fresh": progress.fresh,
    }
    phase = _phase(signals.agent, progress, limits, now, evidence)
    if phase is not None:
        return phase
    if progress.fresh:
        return _with_agent(signals, progress, training_since, thresholds, limits, now, evidence)
    vanished = (f"agent metrics stopped {_min(now - progress.newest_t)} ago; deciding from host metrics and logs",)
    return _without_agent(signals, training_since, logs, thresholds, limits, now, vanished)


def _startup(secondary: str, elapsed_s: float, limits: measures.Limits) -> _Finding:
    if elapsed_s <= limits.startup_s:
        return _Finding(Diagnosis.STARTING, (f"{secondary} for {_min(elapsed_s)} (grace {_min(limits.startup_s)})",))
    reason = f"still {secondary} after {_min(elapsed_s)}, beyond the {_min(limits.startup_s)} startup grace"
    return _Finding(Diagnosis.STARTING, (reason, "startup is never stopped; check the data download"), overdue=True)


def _phase(
    agent: dict[str, Series], progress: measures.Progress, limits: measures.Limits, now: float, evidence: dict[str, Any]
) -> _Finding | None:
    """A declared phase (PhaseBudgetRemaining > 0) with no step since: within budget, or overrunning it."""
    active = [(t, v) for t, v in agent.get("PhaseBudgetRemaining", Series()).points if v > 0]
    if not active:
        return None
    t, remaining = active[-1]
    if progress.last_step_t is not None and progress.last_step_t > t:
        return None  # steps resumed after the phase
    deadline = t + remaining
    evidence["phase"] = {"deadline_t": deadline, "overrun_s": round(max(0.0, now - deadline), 1)}
    if now <= deadline:
        return _Finding(Diagnosis.PHASE, (f"in a declared phase with {_min(deadline - now)} of its budget left",))
    overrun = now - deadline
    if overrun <= limits.overrun_s:
        return _Finding(
            Diagnosis.PHASE,
            (f"declared phase past its budget by {_min(overrun)}, within the {_min(limits.overrun_s)} allowance",),
        )
    if not progress.fresh:
        return None  # the agent vanished: no proof that steps did not resume
    return _Finding(
        Diagnosis.PHASE_OVERRUN,
        (
            f"declared phase overran its budget by {_min(overrun)} (allowance {_min(limits.overrun_s)})",
            "no step completed since the phase began",
        ),
        stoppable=True,
    )


def _with_agent(
    signals: JobSignals,
    progress: measures.Progress,
    training_since: float,
    thresholds: Thresholds,
    limits: measures.Limits,
    now: float,
    evidence: dict[str, Any],
) -> _Finding:
    """Progress decides; utilization, power and error lines explain."""
    if progress.last_step_t is None:
        if now - training_since <= limits.startup_s:
            return _Finding(
                Diagnosis.STARTING,
                (f"no step yet, {_min(now - training_since)} into training (grace {_min(limits.startup_s)})",),
            )
        since = training_since
        no_step = f"no step at all in {_min(now - since)} of training"
    else:
        since = progress.last_step_t
        no_step = f"no completed step for {_min(now - since)} (last step {_fmt(progress.step)})"
    threshold = f"threshold {_min(progress.stall_s)}"
    if progress.interval_s is not None:
        threshold += f" from a {_dur(progress.interval_s)} step interval"
    confirm_s = max(limits.crash_s, CRASH_STEP_INTERVALS * (progress.interval_s or 0.0) * limits.factor)
    errors = measures.errors_since(signals.hosts, since)
    if errors:
        first_error_t = min(line.t for lines in errors.values() for line in lines)
        confirm = min(confirm_s, progress.stall_s)
        if now - first_error_t >= confirm:
            age = f"{no_step}; the first error is {_min(now - first_error_t)} old (confirm {_min(confirm)})"
            return _error_finding(errors, (age, _utilization_summary(evidence["hosts"])))
    # The evidence ladder: no step alone waits the full threshold; with GPU activity fallen on every host as well
    # (power below its baseline, or idle), the two agree and decide after `agreement_fraction` of it.
    early_s = max(thresholds.agreement_fraction * progress.stall_s, min(confirm_s, progress.stall_s))
    hosts = _with_gpus(evidence["hosts"], signals.facts)
    fallen = _gpus_fallen(hosts, thresholds)
    stall_s = early_s if fallen else progress.stall_s
    if now - since > stall_s:
        all_idle = bool(hosts) and all(
            h["gpu_util_now"] is not None and h["gpu_util_now"] < thresholds.idle_gpu_percent for h in hosts.values()
        )
        logs_active = evidence["logs"]["silence_s"] < evidence["logs"]["threshold_s"]
        power = _power_summary(hosts)
        power_dropped = any(h["power_dropped"] for h in hosts.values())
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
        if fallen:
            threshold = f"{threshold}, {_min(stall_s)} as GPU activity fell on every host too"
        reasons = [f"{no_step}, {threshold}", _utilization_summary(hosts)]
        if errors:
            reasons.append(_error_summary(errors))
        if power:
            reasons.append(power)
        if logs_active:
            reasons.append("logs are still active, but the agent reports no steps")
        return _Finding(Diagnosis.IDLE if all_idle else Diagnosis.HANG, tuple(reasons), stoppable=True)
    finding = _progressing(signals, progress, thresholds, limits, now, evidence)
    if now - since > early_s:  # a lone signal: no alarm fires again when it reaches the full threshold
        return replace(finding, recheck_at=since + progress.stall_s)
    return finding


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


def _progressing(
    signals: JobSignals,
    progress: measures.Progress,
    thresholds: Thresholds,
    limits: measures.Limits,
    now: float,
    evidence: dict[str, Any],
) -> _Finding:
    """A job that makes progress: healthy, or one of the problems that are never a stall."""
    agent = signals.agent
    recent_since = now - limits.recent_s
    nonfinite = sum(agent.get("NonFiniteLoss", Series()).since(recent_since).values())
    if nonfinite > 0:
        reason = f"{nonfinite:g} non-finite losses in the last {_min(limits.recent_s)}"
        return _Finding(Diagnosis.NONFINITE_LOSS, (reason,), stoppable=thresholds.stop_on_nonfinite_loss)
    data_wait = agent.get("DataWaitFraction", Series()).since(recent_since).mean()
    if data_wait is not None and data_wait > thresholds.data_wait_percent:
        evidence["data_wait_percent"] = round(data_wait, 1)
        reason = f"waiting for input {data_wait:.0f}% of the time (threshold {thresholds.data_wait_percent:g}%)"
        return _Finding(Diagnosis.DATA_STARVATION, (reason, "still progressing: never stopped for this"))
    lagging = measures.straggler(signals.hosts, now)
    if lagging is not None:
        evidence["straggler"] = lagging
        return _Finding(Diagnosis.STRAGGLER, (_straggler_summary(lagging), "still progressing: never stopped for this"))
    values = [v for _, v in measures.interval_samples(agent)]
    if len(values) > SLOW_SAMPLES:
        current = statistics.median(values[-SLOW_SAMPLES:])
        earlier = statistics.median(values[:-SLOW_SAMPLES])  # the pace over the lookback
        evidence["step_interval_current_s"] = round(current, 3)
        evidence["step_interval_earlier_s"] = round(earlier, 3)
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


def _without_agent(
    signals: JobSignals,
    training_since: float,
    logs: measures.Logs,
    thresholds: Thresholds,
    limits: measures.Limits,
    now: float,
    notes: tuple[str, ...],
) -> _Finding:
    """Host GPU utilization and log silence decide; every host must show the same picture."""
    hosts = list(_with_gpus(signals.hosts, signals.facts).values())
    utils = [measures.gpu_util(h) for h in hosts]
    never_active = all(all(v < thresholds.idle_gpu_percent for v in u.values()) for u in utils)
    if never_active and now - training_since <= limits.startup_s:
        return _Finding(
            Diagnosis.STARTING,
            (*notes, f"GPUs not active yet, {_min(now - training_since)} in (grace {_min(limits.startup_s)})"),
        )
    silence = "logs silent" if logs.last_t is not None else "no log line from any host"
    log_reason = f"{silence} for {_min(logs.silence_s)} (threshold {_min(logs.threshold_s)})"
    crashed: dict[str, list[LogLine]] = {}
    silences: list[str] = []
    for h in hosts:
        lines = measures.last_words(h)
        if not lines or h.log_last_t is None:
            continue
        needed = measures.crash_silence_s(h, thresholds, limits, logs.threshold_s)
        if now - h.log_last_t >= needed:
            crashed[h.host] = lines
            silences.append(f"{h.host} silent for {_min(now - h.log_last_t)} after it (threshold {_min(needed)})")
    if crashed:
        return _error_finding(crashed, (*notes, *silences))
    # Idle GPUs and silent logs are two signals: when both agree they decide after `agreement_fraction` of their
    # thresholds. Neither alone ever stops a job without the agent.
    agree = thresholds.agreement_fraction
    if logs.silence_s < agree * logs.threshold_s:
        return _Finding(Diagnosis.HEALTHY, (*notes, f"within the log-silence threshold: {log_reason}"))
    complete = len(hosts) >= max(signals.facts.gpu_host_count(), 1)
    idle = [measures.trailing_run(u, lambda v: v < thresholds.idle_gpu_percent, now, limits.stale_s) for u in utils]
    if complete and all(d is not None and d >= agree * limits.idle_s for d in idle):
        reason = f"GPUs below {thresholds.idle_gpu_percent:g}% on all {_hosts(hosts)} for {_min(min(idle))}"
        ladder = f"idle GPUs and silent logs agree: each decides after {agree:.2g} of its threshold"
        return _Finding(Diagnosis.IDLE, (*notes, reason, log_reason, ladder), stoppable=True)
    if logs.silence_s < logs.threshold_s:
        # a lone silence: its early alarm does not fire again when it reaches the full threshold
        recheck = None if logs.last_t is None else logs.last_t + logs.threshold_s
        within = f"within the log-silence threshold: {log_reason}"
        return _Finding(Diagnosis.HEALTHY, (*notes, within), recheck_at=recheck)
    # Busy GPUs are what training looks like: only logs that were seen and then fell silent make them a hang.
    # (No log line at all means the logs are unknown, e.g. an EC2 host whose logs are not shipped.) Silence is then
    # the lone signal (a long evaluation looks the same): alerted now, stopped after BUSY_SILENCE_FACTOR x it.
    busy = [measures.trailing_run(u, lambda v: v >= thresholds.busy_gpu_percent, now, limits.stale_s) for u in utils]
    if logs.last_t is not None and complete and all(d is not None and d >= limits.idle_s for d in busy):
        reason = f"GPUs at or above {thresholds.busy_gpu_percent:g}% on all {_hosts(hosts)} for {_min(min(busy))}"
        stop_s = BUSY_SILENCE_FACTOR * logs.threshold_s
        if logs.silence_s >= stop_s:
            return _Finding(Diagnosis.HANG, (*notes, reason, log_reason), stoppable=True)
        lone = f"busy GPUs with silent logs may be a long evaluation: not stopping before {_min(stop_s)} of silence"
        return _Finding(Diagnosis.HANG, (*notes, reason, log_reason, lone))
    return _Finding(
        Diagnosis.HEALTHY, (*notes, log_reason, "but GPU utilization does not show a consistent idle or hung job")
    )


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


def _straggler_summary(lagging: dict[str, Any]) -> str:
    """Which host straggles, by how much, and every host's value (the spread a team cordons a node on)."""
    metric, host, values = lagging["metric"], lagging["host"], lagging["values"]
    unit, side = ("s", "slower") if metric == "StepTime" else ("W", "lower")
    spread = ", ".join(f"{h} {v:g} {unit}" for h, v in values.items())
    return (
        f"straggler {host}: {metric} {values[host]:g} {unit} against a median of {lagging['others_median']:g} {unit} "
        f"on the other {len(values) - 1} hosts ({lagging['ratio']:g}x {side}) for {_min(measures.STRAGGLER_S)}; "
        f"per host: {spread}"
    )


def _power_summary(hosts: dict[str, dict]) -> str | None:
    known = {name: h for name, h in hosts.items() if h["power_w_baseline"] is not None and h["power_w_now"] is not None}
    if not known:
        return None
    dropped = sum(h["power_dropped"] for h in known.values())
    parts = [f"{n} {h['power_w_baseline']:.0f} W -> {h['power_w_now']:.0f} W" for n, h in sorted(known.items())]
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
) -> tuple[Action, Action, tuple[str, ...]]:
    """(action, would, notes): what the mode allows, what enforce would do, and why."""
    if policy.mode is Mode.OFF or not finding.problem:
        return Action.NONE, Action.NONE, ()
    snoozed = state.snoozed_until is not None and state.snoozed_until > now
    snooze_note = (f"snoozed until {state.snoozed_until:.0f}",) if snoozed else ()
    repeat = finding.diagnosis.value in state.alerted
    if policy.mode is Mode.ENFORCE:
        if not finding.stoppable:
            base = Action.AUDIT if snoozed else Action.ALERT
            return (Action.NONE if repeat else base), Action.NONE, snooze_note
        if state.stopped_at is not None:
            return Action.NONE, Action.NONE, (f"stop already requested at {state.stopped_at:.0f}",)
        if snoozed:
            return (Action.NONE if repeat else Action.AUDIT), Action.NONE, snooze_note
        if not policy.may_stop:
            note = "not stopping: the job is not tagged stallwatch:mode=enforce"
            return (Action.NONE if repeat else Action.ALERT), Action.NONE, (note,)
        if state.warned_at is None:
            return Action.WARN, Action.NONE, (f"will stop in {_min(limits.grace_s)} unless it recovers or is snoozed",)
        stop_at = state.warned_at + limits.grace_s
        if now >= stop_at:
            return Action.STOP, Action.NONE, (f"warned {_min(now - state.warned_at)} ago and still stalled",)
        return Action.NONE, Action.NONE, (f"warned; stopping in {_min(stop_at - now)}",)
    would = Action.ALERT
    if finding.stoppable:
        overdue = state.stall_since is not None and now >= state.stall_since + limits.grace_s
        would = Action.STOP if overdue else Action.WARN
    key = WOULD_STOP if would is Action.STOP else finding.diagnosis.value
    base = Action.AUDIT if policy.mode is Mode.OBSERVE or snoozed else Action.ALERT
    return (Action.NONE if key in state.alerted else base), would, snooze_note
