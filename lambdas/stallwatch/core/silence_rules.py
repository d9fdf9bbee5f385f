"""Without the agent (or once its metrics vanish), host GPU utilization and log silence decide.

Every host must show the same picture. Idle GPUs and silent logs are two signals that agree after
`agreement_fraction` of their thresholds; busy GPUs and silent logs are a hang, or an evaluation that logs nothing,
told apart by GPU power where it is reported and else by time and the job's own history.
"""

from __future__ import annotations

import math
from dataclasses import replace

from stallwatch.core import evidence, measures
from stallwatch.core.decision import Diagnosis
from stallwatch.core.findings import STALLING_PERIODS, Context, Finding, benign_wait, error_finding, with_gpus
from stallwatch.core.measures import LEARNED_GAP_MARGIN
from stallwatch.core.reasons import host_count, minutes, power_summary
from stallwatch.core.signals import LogLine

# Without the agent, busy GPUs and silent logs are one signal (busy GPUs are what training and a long evaluation look
# like), alerted at the log threshold; where GPU power holds its baseline (compute runs), stopped only after this many
# times it (without power: `Thresholds.busy_silence_minutes` and the job's own history).
BUSY_SILENCE_FACTOR = 4.0
CHECKPOINT_JOIN_INTERVALS = 2.0  # no agent: other hosts' lines may follow a checkpoint's start by this many cadences


def without_agent(ctx: Context, hosts: dict[str, evidence.Host], notes: tuple[str, ...]) -> Finding:
    """Host GPU utilization and log silence decide; every host must show the same picture."""
    signals, thresholds, limits, now, logs = ctx.signals, ctx.thresholds, ctx.limits, ctx.now, ctx.logs
    gpu_hosts = list(with_gpus(signals.hosts, signals.facts).values())
    utils = [measures.gpu_util(h) for h in gpu_hosts]
    never_active = all(all(v < thresholds.idle_gpu_percent for v in u.values()) for u in utils)
    if never_active and now - ctx.training_since <= limits.startup_s:
        ctx.deadlines.add(ctx.training_since + limits.startup_s)
        return Finding(
            Diagnosis.STARTING,
            (
                *notes,
                f"GPUs not active yet, {minutes(now - ctx.training_since)} in (grace {minutes(limits.startup_s)})",
            ),
        )
    silence = "logs silent" if logs.last_t is not None else "no log line from any host"
    log_reason = f"{silence} for {minutes(logs.silence_s)} (threshold {minutes(logs.threshold_s)})"
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
            silences.append(f"{h.host} silent for {minutes(now - h.log_last_t)} after it (threshold {minutes(needed)})")
    if crashed:
        return error_finding(crashed, (*notes, *silences))
    last = logs.last_t if logs.last_t is not None else ctx.training_since
    silent = logs.silence_s >= STALLING_PERIODS * ctx.period  # no alarm announces the later rungs of a silence
    if logs.last_t is not None and evidence.spinning(hosts, thresholds):
        if silent:
            ctx.deadlines.add(last + limits.crash_s)
        if now - last >= limits.crash_s:
            hosts_ev = with_gpus(ctx.evidence["hosts"], signals.facts)
            reasons = (
                *notes,
                f"a collective spins on every host (GPUs busy, power fallen) and {log_reason}",
                *filter(None, [power_summary(hosts_ev)]),
            )
            return Finding(Diagnosis.HANG, reasons, stoppable=True, conclusive=True)
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
            benign = benign_wait(ctx, hosts, last, logs.threshold_s, slack)
            if benign is not None:
                return replace(benign, reasons=(*notes, *benign.reasons))
            on_all = f"on all {host_count(gpu_hosts)} for {minutes(min(idle))}"
            reason = f"GPUs below {thresholds.idle_gpu_percent:g}% {on_all}"
            ladder = f"idle GPUs and silent logs agree: each decides after {agree:.2g} of its threshold"
            return Finding(Diagnosis.IDLE, (*notes, reason, log_reason, ladder), stoppable=True)
    if logs.silence_s < min(logs.threshold_s, stop_s):
        if logs.silence_s >= agree * logs.threshold_s or hung:
            ctx.deadlines.add(last + min(logs.threshold_s, stop_s))
        return Finding(Diagnosis.HEALTHY, (*notes, f"within the log-silence threshold: {log_reason}"))
    if not hung:
        return Finding(
            Diagnosis.HEALTHY, (*notes, log_reason, "but GPU utilization does not show a consistent idle or hung job")
        )
    # Busy GPUs and silent logs: a hang, or an evaluation that logs nothing. Alerted at the log threshold, stopped
    # once the silence outlasts what the job's own history allows (`_busy_silence_s`).
    on_all = f"on all {host_count(gpu_hosts)} for {minutes(min(busy))}"
    reason = f"GPUs at or above {thresholds.busy_gpu_percent:g}% {on_all}"
    ctx.deadlines.add(last + stop_s)
    if logs.silence_s >= stop_s:
        return Finding(Diagnosis.HANG, (*notes, reason, log_reason, *why), stoppable=True)
    lone = f"busy GPUs with silent logs may be a long evaluation: not stopping before {minutes(stop_s)} of silence"
    return Finding(Diagnosis.HANG, (*notes, reason, log_reason, lone, *why))


def _busy_silence_s(ctx: Context, hosts: dict[str, evidence.Host]) -> tuple[float, tuple[str, ...]]:
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
        f"the longest silence with busy GPUs it came back from is {minutes(learned)}"
        if learned is not None
        else "it was never silent that long with busy GPUs"
    )
    power = (
        f"no GPU power reported: with it (the agent, or the CloudWatch agent's power_draw on EC2) a hung collective "
        f"would be decided {minutes(limits.crash_s)} after its last progress"
    )
    return stop_s, (history, power)
