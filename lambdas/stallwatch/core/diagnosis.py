"""What is happening to a running job: startup, evidence of death, a declared phase, then the evidence ladder with the
agent (`progress_rules`) or without it (`silence_rules`). The engine (`core.engine`) turns the finding into an action.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stallwatch.core import evidence, measures, stack_dumps
from stallwatch.core.contract import STACKS_MARKER
from stallwatch.core.decision import Cadence, Diagnosis, JobState
from stallwatch.core.findings import Context, Deadlines, Finding, error_finding, with_gpus
from stallwatch.core.platforms import describe
from stallwatch.core.policy import Thresholds
from stallwatch.core.progress_rules import with_agent
from stallwatch.core.reading import host_period
from stallwatch.core.reasons import error_summary, minutes, utilization_summary
from stallwatch.core.signals import JobSignals, LogLine, Series
from stallwatch.core.silence_rules import without_agent

UPLOADING_STATUS = "Uploading"
STALL = "stall"  # a stack dump's reason when the agent's stall watch wrote it (SIGTERM's are the stop's own)
QUOTED_CHARS = 200  # of an unconfirmed fatal line, quoted in the alert
UNCONFIRMED = (
    "a printed line alone never stops a job: waiting for a second witness (the GPUs letting go or falling, a host "
    "vanishing, or the step or line the job's cadence owes not coming)"
)
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


def diagnose(
    signals: JobSignals,
    thresholds: Thresholds,
    limits: measures.Limits,
    state: JobState,
    now: float,
    found: dict[str, Any],
    deadlines: Deadlines,
) -> tuple[Finding, Cadence]:
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
        return Finding(Diagnosis.HEALTHY, ("uploading model artifacts after training",)), remembered
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
    ctx = Context(
        signals, thresholds, limits, now, found, deadlines, training_since, logs, period, pauses, deaths=state.deaths
    )
    return _diagnose_running(ctx, progress), cadence


def _diagnose_running(ctx: Context, progress: measures.Progress | None) -> Finding:
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
        return _unconfirmed(ctx, hosts, without_agent(ctx, hosts, ()), None)
    phase = _phase(ctx, progress)
    if phase is not None:
        return phase
    if progress.fresh:
        return _unconfirmed(ctx, hosts, with_agent(ctx, hosts, progress), progress)
    stopped = minutes(ctx.now - progress.newest_t)
    notes = (f"agent metrics stopped {stopped} ago; deciding from host metrics and logs",)
    return _unconfirmed(ctx, hosts, without_agent(ctx, hosts, notes, progress.newest_t), None)


def _unconfirmed(
    ctx: Context, hosts: dict[str, evidence.Host], finding: Finding, progress: measures.Progress | None
) -> Finding:
    """A healthy finding, unless the job said something no stop may rest on alone: fatal last words it has not
    printed past (a hypothesis until a second witness confirms it: its GPUs, its metrics gone, or the step or line
    its cadence owes), or, with the agent, the stacks its stall watch wrote since the last step, ranks waiting in a
    collective. Either is alerted with its words (and the stacks' why), never stopped."""
    if finding.diagnosis is not Diagnosis.HEALTHY:
        return finding
    since = evidence.said_t(hosts) if progress is None else progress.last_step_t or ctx.training_since
    words = {
        name: list(h.last_words)
        for name, h in hosts.items()
        if h.last_words_t is not None and (since is None or h.last_words_t + evidence.LAST_WORDS_S >= since)
    }
    waiting = _waiting_ranks(ctx, hosts, progress)
    if not words and not waiting:
        return finding
    reasons = list(finding.reasons)
    if waiting:
        reasons.insert(0, waiting)
    if words:
        name = min(words, key=lambda n: words[n][0].t)  # the first to speak; its burst's last line says what failed
        reasons[:0] = [error_summary(words), f'{name}: "{words[name][-1].message[:QUOTED_CHARS]}"', UNCONFIRMED]
        return replace(error_finding(words, ()), reasons=tuple(reasons), stoppable=False)
    return Finding(Diagnosis.HANG, tuple(reasons))


def _waiting_ranks(ctx: Context, hosts: dict[str, evidence.Host], progress: measures.Progress | None) -> str | None:
    """With the agent, its stall watch's dumps since the last step (`stack_dumps`) showing most ranks waiting in a
    collective, while no live job's wait explains the missing step (a checkpoint's lines, input): why, in words."""
    if progress is None or progress.last_step_t is None:
        return None
    dumps = [d for d in stack_dumps.latest(dump_lines(ctx.signals), progress.last_step_t) if d.reason == STALL]
    in_collective = sum(d.waiting for d in dumps)
    if not dumps or in_collective * 2 <= len(dumps):
        return None
    wait = ctx.signals.agent.get("DataWaitFraction", Series()).since(progress.last_step_t).mean()
    explained = (
        evidence.checkpoint_since(hosts, progress.last_step_t) is not None
        or evidence.checkpoint_ended(hosts, progress.last_step_t) is not None
        or (wait is not None and wait > ctx.thresholds.data_wait_percent)
    )
    if explained:
        return None
    return (
        f"no step for {minutes(ctx.now - progress.last_step_t)}: the agent's stall watch wrote {len(dumps)} ranks' "
        f"stacks, {in_collective} waiting in a collective (alerted early; a stop needs the ladder's evidence)"
    )


def dump_lines(signals: JobSignals) -> tuple[LogLine, ...]:
    """The agent's stack dumps a decision holds: those read since the last step, and those in the hosts' log tails
    (a dump written a minute into a stall precedes any metric that shows the stall, so the reads may not ask for
    it yet)."""
    tails = (line for host in signals.hosts.values() for line in host.log_tail if STACKS_MARKER in line.message)
    return tuple(sorted({*signals.stacks, *tails}, key=lambda line: (line.t, line.stream, line.message)))


def _life_signs(host: evidence.Host) -> dict[str, Any]:
    """A host's life signs in the decision's evidence."""
    return {
        "gpu_memory_now": host.memory_now,
        "memory_released_t": host.released_since,
        "newest_data_t": host.newest_data_t,
        "checkpoint_since_t": host.checkpoint_since,
    }


def _conclusive(ctx: Context, hosts: dict[str, evidence.Host], last_step_t: float | None) -> Finding | None:
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
    words = [t for h in hosts.values() if (t := h.last_words_t) is not None]
    if words:
        ctx.evidence["words_t"] = sorted(words)  # the job's state keeps them: a crash loop shows across decisions
    loop = evidence.crash_loop(ctx.signals, hosts, ctx.deaths, ctx.thresholds, ctx.now)
    deaths += [loop] if loop is not None else []
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
        reasons.append(error_summary(found.lines))
    reasons.append(f"no progress for {minutes(ctx.now - found.onset)} since (confirm {minutes(confirm)})")
    reasons.append(utilization_summary(with_gpus(ctx.evidence["hosts"], ctx.signals.facts)))
    return Finding(found.diagnosis, tuple(reasons), stoppable=True, conclusive=found.conclusive)


def _startup(secondary: str, elapsed_s: float, limits: measures.Limits) -> Finding:
    elapsed, grace = minutes(elapsed_s), minutes(limits.startup_s)
    if elapsed_s <= limits.startup_s:
        return Finding(Diagnosis.STARTING, (f"{secondary} for {elapsed} (grace {grace})",))
    reason = f"still {secondary} after {elapsed}, beyond the {grace} startup grace"
    return Finding(Diagnosis.STARTING, (reason, "startup is never stopped; check the data download"), overdue=True)


def _phase(ctx: Context, progress: measures.Progress) -> Finding | None:
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
        return Finding(Diagnosis.PHASE, (f"in a declared phase with {minutes(deadline - now)} of its budget left",))
    overrun = now - deadline
    if overrun <= allowance:
        return Finding(
            Diagnosis.PHASE,
            (f"declared phase past its budget by {minutes(overrun)}, within the {minutes(allowance)} allowance",),
        )
    if not progress.fresh:
        return None  # the agent vanished: no proof that steps did not resume
    return Finding(
        Diagnosis.PHASE_OVERRUN,
        (
            f"declared phase overran its budget by {minutes(overrun)} (allowance {minutes(allowance)})",
            "no step completed since the phase began",
        ),
        stoppable=True,
    )


def _ended_before(active: tuple[float, float], after: tuple[float, float], deadline: float) -> bool:
    """Whether the 0 at `after` (a period's aggregate, as `active` is) covers only moments before `deadline`."""
    return after[0] + (after[0] - active[0]) <= deadline
