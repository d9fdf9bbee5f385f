"""With the agent, progress decides: the evidence ladder on steps, with utilization, power and logs to corroborate.

No step alone waits the full stall threshold; GPU activity fallen on every host brings it to `agreement_fraction` of
it; a collective spinning on every host, or a rank's fatal last words, after `crash_confirm_minutes`. A job that steps
may still be slow, starved of input, losing non-finite values or waiting on a straggler: never a stall.
"""

from __future__ import annotations

import math
import statistics

from stallwatch.core import evidence, measures
from stallwatch.core.decision import Diagnosis
from stallwatch.core.findings import (
    STALLING_PERIODS,
    Context,
    Finding,
    benign_wait,
    error_finding,
    every_host_said,
    with_gpus,
)
from stallwatch.core.policy import Thresholds
from stallwatch.core.reasons import (
    duration,
    error_summary,
    minutes,
    number,
    power_summary,
    straggler_summary,
    utilization_summary,
)
from stallwatch.core.signals import Series

SLOW_RATIO = 1.5  # current step interval over the earlier one above this is slow (a doubling is)
SLOW_SAMPLES = 3  # the current interval: the median of this many latest samples (one slow checkpoint step is not slow)
CRASH_STEP_INTERVALS = 2.0  # a crashed rank needs at least this many step intervals without a step
STARVED_WINDOWS = 3  # data starvation is seen in at least this many recent windows that completed steps


def with_agent(ctx: Context, hosts: dict[str, evidence.Host], progress: measures.Progress) -> Finding:
    """Progress decides; utilization, power and error lines explain. The evidence ladder: no step alone waits the full
    stall threshold; with GPU activity fallen on every host it decides after `agreement_fraction` of it; a collective
    spinning on every host (no step, GPUs busy, power fallen) or a rank's fatal last words after `crash_confirm`."""
    thresholds, limits, now, ev = ctx.thresholds, ctx.limits, ctx.now, ctx.evidence
    if progress.last_step_t is None:
        ctx.deadlines.add(ctx.training_since + limits.startup_s)
        if now - ctx.training_since <= limits.startup_s:
            return Finding(
                Diagnosis.STARTING,
                (
                    f"no step yet, {minutes(now - ctx.training_since)} into training "
                    f"(grace {minutes(limits.startup_s)})",
                ),
            )
        since = ctx.training_since
        no_step = f"no step at all in {minutes(now - since)} of training"
    else:
        since = progress.last_step_t
        no_step = f"no completed step for {minutes(now - since)} (last step {number(progress.step)})"
    threshold = f"threshold {minutes(progress.stall_s)}"
    if progress.interval_s is not None:
        threshold += f" from a {duration(progress.interval_s)} step interval"
    confirm_s = min(max(limits.crash_s, _intervals_s(ctx, progress)), progress.stall_s)
    gpu_hosts = with_gpus(ev["hosts"], ctx.signals.facts)
    # A rank's fatal last words after the last step, its GPUs not (yet) seen dead: the line and the step its step
    # time owed agree after `crash_confirm` (two step intervals), unless the GPUs still compute or a live job's wait
    # explains the missing step (a checkpoint, input, a pause like those it came back from).
    errors = {name: list(h.last_words) for name, h in hosts.items() if (h.last_words_t or -math.inf) >= since}
    if errors:
        first_error_t = min(lines[0].t for lines in errors.values())
        ctx.deadlines.add(first_error_t + confirm_s)
        if now - first_error_t >= confirm_s and not _explained(ctx, hosts, gpu_hosts, since, progress):
            age = f"{no_step}; the first error is {minutes(now - first_error_t)} old (confirm {minutes(confirm_s)})"
            conclusive = every_host_said(errors, ctx.signals.facts)
            return error_finding(errors, (age, utilization_summary(ev["hosts"])), conclusive=conclusive)
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
                *([error_summary(lines)] if lines else []),
                f"{no_step}: a collective spins on every host (GPUs busy, power fallen), confirm {minutes(spin_s)}",
                utilization_summary(gpu_hosts),
                *filter(None, [power_summary(gpu_hosts)]),
                *(["logs are still active, but the agent reports no steps"] if logs_active else []),
            )
            return Finding(Diagnosis.HANG, reasons, stoppable=True, conclusive=True)
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
        power = power_summary(gpu_hosts)
        if _computing(gpu_hosts, thresholds):
            # GPUs still draw their working power: compute runs (a step far longer than before), not a hang.
            return Finding(
                Diagnosis.SLOW,
                (f"{no_step}, {threshold}", f"but GPU power holds: {power}", "not stopping while the GPUs compute"),
            )
        if progress.last_step_t is None and not (all_idle or not logs_active):
            # Never a step, yet the GPUs work and the logs flow: more likely agent.step() is not called.
            return Finding(
                Diagnosis.STARTING,
                (f"{no_step}, yet GPUs are busy and logs active", "is agent.step() called? not stopping for this"),
                overdue=True,
            )
        benign = benign_wait(ctx, hosts, since, progress.stall_s)
        if benign is not None:
            return benign
        if fallen:
            threshold = f"{threshold}, {minutes(stall_s)} as GPU activity fell on every host too"
        reasons = [f"{no_step}, {threshold}", utilization_summary(gpu_hosts)]
        if power:
            reasons.append(power)
        if logs_active:
            reasons.append("logs are still active, but the agent reports no steps")
        return Finding(Diagnosis.IDLE if all_idle else Diagnosis.HANG, tuple(reasons), stoppable=True)
    return _progressing(ctx, progress)


def _computing(hosts: dict[str, dict], thresholds: Thresholds) -> bool:
    """GPUs that still draw their working power: power reported, fallen on no host, not idle on every host."""
    all_idle = bool(hosts) and all(
        h["gpu_util_now"] is not None and h["gpu_util_now"] < thresholds.idle_gpu_percent for h in hosts.values()
    )
    return power_summary(hosts) is not None and not all_idle and not any(h["power_dropped"] for h in hosts.values())


def _explained(
    ctx: Context, hosts: dict[str, evidence.Host], gpu_hosts: dict[str, dict], since: float, progress: measures.Progress
) -> bool:
    """No step since `since`, yet the job lives: its GPUs compute, or a benign wait holds (`benign_wait`)."""
    if _computing(gpu_hosts, ctx.thresholds):
        return True
    benign = benign_wait(ctx, hosts, since, progress.stall_s)
    return benign is not None and not benign.stoppable


def _intervals_s(ctx: Context, progress: measures.Progress | None) -> float:
    """`CRASH_STEP_INTERVALS` step intervals: no evidence decides before a slow step could have ended."""
    interval = progress.interval_s if progress is not None else None
    return CRASH_STEP_INTERVALS * (interval or 0.0) * ctx.limits.factor


def _gpus_fallen(hosts: dict[str, dict], thresholds: Thresholds) -> bool:
    """Every host's GPUs fell silent: power below `power_drop_ratio` x its baseline, or utilization idle."""
    return bool(hosts) and all(
        h["power_dropped"] or (h["gpu_util_now"] is not None and h["gpu_util_now"] < thresholds.idle_gpu_percent)
        for h in hosts.values()
    )


def _progressing(ctx: Context, progress: measures.Progress) -> Finding:
    """A job that makes progress: healthy, or one of the problems that are never a stall."""
    agent, thresholds, now, evidence_ = ctx.signals.agent, ctx.thresholds, ctx.now, ctx.evidence
    recent_since = now - ctx.limits.recent_s
    nonfinite = sum(agent.get("NonFiniteLoss", Series()).since(recent_since).values())
    if nonfinite > 0:
        reason = f"{nonfinite:g} non-finite losses in the last {minutes(ctx.limits.recent_s)}"
        return Finding(Diagnosis.NONFINITE_LOSS, (reason,), stoppable=thresholds.stop_on_nonfinite_loss)
    data_wait = _stepping_data_wait(agent, recent_since)
    if data_wait is not None and data_wait > thresholds.data_wait_percent:
        evidence_["data_wait_percent"] = round(data_wait, 1)
        reason = f"waiting for input {data_wait:.0f}% of the time (threshold {thresholds.data_wait_percent:g}%)"
        return Finding(Diagnosis.DATA_STARVATION, (reason, "still progressing: never stopped for this"))
    hosts, facts, limits, period = ctx.signals.hosts, ctx.signals.facts, ctx.limits, ctx.period
    lagging, due = measures.straggler(hosts, facts, thresholds, limits, now, period)
    ctx.deadlines.add(due)  # a host lagging for less than the window yet is named when its window fills
    if lagging is not None:
        evidence_["straggler"] = lagging
        summary = straggler_summary(lagging, measures.straggler_window(limits, period))
        return Finding(Diagnosis.STRAGGLER, (summary, "still progressing: never stopped for this"))
    values = [v for _, v in measures.interval_samples(agent)]
    if len(values) > SLOW_SAMPLES:
        current = statistics.median(values[-SLOW_SAMPLES:])
        earlier = statistics.median(values[:-SLOW_SAMPLES])  # the pace over the lookback
        evidence_["step_interval_current_s"] = round(current, 3)
        evidence_["step_interval_earlier_s"] = round(earlier, 3)
        if current > SLOW_RATIO * earlier:
            return Finding(
                Diagnosis.SLOW,
                (
                    f"steps take {duration(current)}, {current / earlier:.1f}x the earlier {duration(earlier)}",
                    "still progressing: never stopped for this",
                ),
            )
    age = "no step yet" if progress.last_step_t is None else f"last step {minutes(now - progress.last_step_t)} ago"
    return Finding(Diagnosis.HEALTHY, (f"progressing: {age} (stall threshold {minutes(progress.stall_s)})",))


def _stepping_data_wait(agent: dict[str, Series], since: float) -> float | None:
    """The mean DataWaitFraction of the recent windows in which steps completed (at least `STARVED_WINDOWS`): a
    pause (an undeclared checkpoint, an evaluation) is all waiting to the agent, and no starvation."""
    stepped = {t for t, v in agent.get("Steps", Series()).since(since).points if v > 0}
    waits = [v for t, v in agent.get("DataWaitFraction", Series()).since(since).points if t in stepped]
    return statistics.mean(waits) if len(waits) >= STARVED_WINDOWS else None
