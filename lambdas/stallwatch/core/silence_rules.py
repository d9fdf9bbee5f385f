"""Without the agent (or once its metrics vanish), host GPU utilization and log silence decide.

Every host must show the same picture. Idle GPUs and silent logs are two signals that agree after
`agreement_fraction` of their thresholds; busy GPUs and silent logs are a hang, or an evaluation that logs nothing,
told apart by GPU power where it is reported and else by time and the job's own history.
"""

from __future__ import annotations

import math
from dataclasses import replace

from stallwatch.core import evidence, log_patterns, measures
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
from stallwatch.core.measures import LEARNED_GAP_MARGIN
from stallwatch.core.reasons import host_count, minutes, power_summary
from stallwatch.core.signals import LogLine

# Without the agent, busy GPUs and silent logs are one signal (busy GPUs are what training and a long evaluation look
# like), alerted at the log threshold; where GPU power holds its baseline (compute runs), stopped only after this many
# times it (without power: `Thresholds.busy_silence_minutes` and the job's own history).
BUSY_SILENCE_FACTOR = 4.0
COLLECTIVE_TIMEOUTS = frozenset({log_patterns.NCCL_TIMEOUT, log_patterns.C10D_TIMEOUT})
CHECKPOINT_JOIN_INTERVALS = 2.0  # no agent: other hosts' lines may follow a checkpoint's start by this many cadences


def without_agent(
    ctx: Context, hosts: dict[str, evidence.Host], notes: tuple[str, ...], agent_stopped_t: float | None = None
) -> Finding:
    """Host GPU utilization and log silence decide; every host must show the same picture. `agent_stopped_t`: the
    agent's newest datapoint, where it reported and stopped (its process may have exited)."""
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
    idle = [measures.trailing_run(u, lambda v: v < thresholds.idle_gpu_percent, now, stale_s) for u in utils]
    all_busy = logs.last_t is not None and complete and all(d is not None and d >= limits.idle_s for d in busy)
    hung = silent and all_busy
    words_t = min((t for h in hosts.values() if (t := h.last_words_t) is not None), default=math.inf)
    spoke = words_t < math.inf
    stop_s, why = _busy_silence_s(ctx, hosts, words_t) if all_busy and (hung or spoke) else (math.inf, ())
    all_idle = complete and all(d is not None for d in idle)
    crashed = _words_overdue(ctx, hosts, notes, stop_s, all_idle, agent_stopped_t)
    if crashed is not None:
        return crashed
    # Idle GPUs and silent logs are two signals: when both agree they decide after `agreement_fraction` of their
    # thresholds. Neither alone ever stops a job without the agent.
    agree = thresholds.agreement_fraction
    if silent:
        ctx.deadlines.add(last + agree * logs.threshold_s)
    if logs.silence_s >= agree * logs.threshold_s:
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


def _words_overdue(
    ctx: Context,
    hosts: dict[str, evidence.Host],
    notes: tuple[str, ...],
    busy_stop_s: float,
    all_idle: bool,
    agent_stopped_t: float | None,
) -> Finding | None:
    """A rank's fatal last words, its GPUs not seen dead (that is evidence of death), confirmed by a second witness
    its printing cannot supply: its process's agent stopped reporting with them (`agent_stopped_t`), or the line a
    habit owes did not come. While no host printed past the words, the job's (`line_owed_s`; busy GPUs without
    power may stay silent as long as its history allows, `_busy_silence_s`; idle GPUs are the idle rung's, with its
    benign waits); while the others print on, the speaking host's own (`measures.host_line_owed_s`: a rank without a
    regular habit owes none)."""
    spoken = {name: h for name, h in hosts.items() if h.last_words_t is not None}
    if not spoken:
        return None
    if agent_stopped_t is not None:
        period = 2 * ctx.period
        exited = {n: list(h.last_words) for n, h in spoken.items() if abs(h.last_words_t - agent_stopped_t) <= period}
        if exited:
            ago = minutes(ctx.now - agent_stopped_t)
            stopped = f"the agent stopped reporting with them ({ago} ago): a process exited"
            return error_finding(exited, (*notes, stopped))
    said = evidence.said_t(hosts)
    printed_on = {n for n, h in spoken.items() if said is not None and said > h.last_words_t + evidence.LAST_WORDS_S}
    owed: dict[str, tuple[float, float]] = {}  # host -> (the line a silence counts from, how long a line is owed)
    for name in printed_on:
        host, host_owed = (
            ctx.signals.hosts[name],
            measures.host_line_owed_s(ctx.signals.hosts[name], ctx.thresholds, ctx.limits),
        )
        if host_owed is not None and host.log_last_t is not None:
            owed[name] = (host.log_last_t, host_owed)  # its own silence after its words
    silent_job = [n for n in spoken if n not in printed_on]
    if silent_job and not all_idle:
        first = min(spoken[n].last_words_t or 0.0 for n in silent_job)
        if said is None:  # no line but the words in the tail: the sawtooth saw the one before them
            said = measures.newest_line_before(ctx.signals.hosts.values(), first, ctx.period)
        since = said if said is not None else first
        job_owed = measures.line_owed_s(ctx.signals.hosts.values(), ctx.logs, ctx.limits, ctx.training_since, first)
        # A collective's timeout says its own wait was long: no evaluation prints it. Other words may precede one.
        kinds = {measures.fatal(line) for n in silent_job for line in spoken[n].last_words}
        if not kinds <= COLLECTIVE_TIMEOUTS:
            job_owed = max(job_owed, busy_stop_s)
        owed |= {n: (since, job_owed) for n in silent_job}
    overdue: dict[str, list[LogLine]] = {}
    silences: list[str] = []
    for name, (since, owed_s) in sorted(owed.items()):
        # ... and never before the words are a period old (a line after them would make them no last words)
        decisive = max(since + owed_s, (spoken[name].last_words_t or 0.0) + evidence.ALL_FATAL_CONFIRM_S)
        ctx.deadlines.add(decisive)
        if ctx.now >= decisive:
            overdue[name] = list(spoken[name].last_words)
            who = name if name in printed_on else "no host"
            silence = f"{who}: no line for {minutes(ctx.now - since)}, its habit owed one in {minutes(owed_s)}"
            if silence not in silences:
                silences.append(silence)
    if not overdue:
        return None
    return error_finding(overdue, (*notes, *silences), conclusive=every_host_said(overdue, ctx.signals.facts))


def _busy_silence_s(ctx: Context, hosts: dict[str, evidence.Host], words_t: float) -> tuple[float, tuple[str, ...]]:
    """How long busy GPUs and silent logs may last before they are stopped as a hang, and why.

    GPU power that holds its baseline says compute runs (a long evaluation): BUSY_SILENCE_FACTOR x the log threshold.
    Without power (SageMaker without the agent, EC2 without the CloudWatch agent's power_draw) nothing tells a
    collective spinning from an evaluation but time and the job's own history: LEARNED_GAP_MARGIN x the longest
    silence with busy GPUs it came back from (its own evaluations, beyond its logging habit's gaps), at least
    `log_silence_minutes`; before it has shown one, `busy_silence_minutes`. A rare logger's line was due that much
    later (its interval beyond a period; read before any host's fatal last words at `words_t`)."""
    limits, learned = ctx.limits, ctx.pauses.busy_s
    if any(h.reports_power for h in hosts.values() if h.gpus):
        return BUSY_SILENCE_FACTOR * ctx.logs.threshold_s, ("GPU power holds: compute runs, as in an evaluation",)
    interval = measures.log_interval(ctx.signals.hosts.values(), ctx.training_since, words_t) or 0.0
    overdue = max(0.0, interval - ctx.period)  # a rare logger's silence counts from the line it owed
    # A job that has shown how long it goes silent with busy GPUs (its evaluations) is held to its own history,
    # never below the base log-silence threshold; one that has not, to the default.
    shown = learned is not None and learned > LEARNED_GAP_MARGIN * interval  # more than its habit's own gaps
    floor = limits.log_floor_s if shown else limits.busy_silence_s
    stop_s = max(floor, LEARNED_GAP_MARGIN * (learned or 0.0) * limits.factor) + overdue
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
