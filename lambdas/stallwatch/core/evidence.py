"""What the hosts say about life and death beyond progress: a rank's fatal last words, a host that vanished, GPUs
every process let go of, a collective spinning on every host, a checkpoint being written. Pure: no I/O, no clock.

    hosts = evidence.read_hosts(signals, since, thresholds, limits, now)
    deaths = evidence.death(hosts, last_step_t, training_since, thresholds, limits, period, now)  # most specific first
    spin = evidence.spinning(hosts, thresholds)                                                   # a collective spins

Each piece is evidence at once: none waits for a cadence the job learned from its healthy gaps (that may widen the
silence a job is allowed, never delay evidence of death). Confirming it takes `crash_confirm_minutes` with no
progress since, so that a rank restarted by its launcher (new lines, GPUs taken again) is never taken for dead.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stallwatch.core import log_patterns
from stallwatch.core.decision import Diagnosis
from stallwatch.core.measures import (
    LAST_WORDS_S,
    Limits,
    agent_power,
    fatal,
    gpu_memory,
    gpu_util,
    newest_line_t,
    rounded,
)
from stallwatch.core.policy import Thresholds
from stallwatch.core.signals import HostSignals, JobSignals, LogLine, Series

FATAL_BURST_S = 120.0  # fatal lines this close before a host's last fatal line belong to its last words
VANISHED_PERIODS = 4  # no datapoint from a host for this many periods, while another host's is at most
FRESH_PERIODS = 3  # ... this many old: the host vanished (its datapoints are stamped at their period's start)
# every host's log ended with fatal lines (NCCL watchdog timeouts, ...) and the GPUs agree: one period confirms
ALL_FATAL_CONFIRM_S = 60.0
# A crash loop: a rank's fatal last words this many times within this long (a launcher restarting ranks that die the
# same way each time), its processes letting go of their GPUs since the first and no GPU working again
CRASH_LOOP_DEATHS = 3
CRASH_LOOP_WINDOW_S = 1800.0
MARKER_RUN_S = 300.0  # checkpoint start lines this close together belong to one checkpoint (a line per shard)
POWER_REPORTING_SHARE = 0.5  # a spinning collective needs GPU power from at least this share of the hosts


@dataclass(frozen=True)
class Host:
    """One host's life signs as of `now`, with `since` the job's last progress (last step, else newest log line)."""

    name: str
    gpus: bool  # has accelerators (a heterogeneous cluster's CPU-only hosts have none)
    newest_data_t: float | None  # its newest datapoint of any GPU or agent host metric
    util_now: float | None  # mean GPU utilization per device over the recent periods
    memory_now: float | None  # mean GPU memory per device over the recent periods
    released_since: float | None  # its GPU memory, held before, below `idle_gpu_percent` since then
    idle_since: float | None  # its GPU utilization below `idle_gpu_percent` since then
    power_dropped: bool  # GPU power below `power_drop_ratio` x its baseline
    reports_power: bool
    last_words: tuple[LogLine, ...]  # the fatal lines its log ended with (no other line after them)
    checkpoint_since: float | None  # its newest checkpoint marker is a start, nothing after it: writing since then
    checkpoint_ended: float | None  # its newest checkpoint marker is an end: the checkpoint was over then
    said_t: float | None  # its newest line that is not among its fatal last words: when its log last showed life

    @property
    def last_words_t(self) -> float | None:
        return self.last_words[0].t if self.last_words else None


def read_hosts(
    signals: JobSignals, since: float, thresholds: Thresholds, limits: Limits, now: float
) -> dict[str, Host]:
    """Every host's life signs; `since` is the job's last progress (power before it is the baseline)."""
    return {
        name: _host(host, bool(signals.facts.gpus_on(name)), since, thresholds, limits, now)
        for name, host in signals.hosts.items()
    }


def _host(host: HostSignals, gpus: bool, since: float, thresholds: Thresholds, limits: Limits, now: float) -> Host:
    util, memory, power = gpu_util(host), gpu_memory(host), gpu_power(host)
    newest = [s.points[-1][0] for s in (util, memory, power, *host.agent.values()) if len(s)]
    power_before = power.between(float("-inf"), since).values()
    power_now = _recent(power, since, now, limits).mean()
    baseline = statistics.median(power_before) if power_before else None
    idle = thresholds.idle_gpu_percent
    words = _last_words(host)
    return Host(
        name=host.host,
        gpus=gpus,
        newest_data_t=max(newest, default=None),
        util_now=rounded(_recent(util, since, now, limits).mean()),
        memory_now=rounded(_recent(memory, since, now, limits).mean()),
        released_since=_run_start(memory, lambda v: v < idle, now, limits.stale_s, held_before=idle),
        idle_since=_run_start(util, lambda v: v < idle, now, limits.stale_s),
        power_dropped=baseline is not None
        and power_now is not None
        and power_now < thresholds.power_drop_ratio * baseline,
        reports_power=power_now is not None,
        last_words=words,
        checkpoint_since=_checkpoint_since(host),
        checkpoint_ended=_checkpoint_ended(host),
        said_t=_said_t(host, words),
    )


def _recent(series: Series, since: float, now: float, limits: Limits) -> Series:
    """The datapoints after the last progress, within the recent periods: what the GPUs do now."""
    start = now - limits.recent_s
    return Series(tuple(p for p in series.points if p[0] > since and p[0] >= start))


def gpu_power(host: HostSignals) -> Series:
    """Per-device power: the agent's (NVML's watts, or a NeuronCore's % of its maximum), else the platform's (EC2:
    the CloudWatch agent's)."""
    agent, _ = agent_power(host)
    return agent if len(agent) else host.gpu_power


def _run_start(
    series: Series, holds: Callable[[float], bool], now: float, stale_s: float, held_before: float | None = None
) -> float | None:
    """When the newest run of datapoints for which `holds` is true began (None: the newest fails, or is stale).
    With `held_before`, the run counts only if an earlier datapoint was at or above it (memory let go, not never
    taken)."""
    points = series.points
    if not points or now - points[-1][0] > stale_s or not holds(points[-1][1]):
        return None
    start, i = points[-1][0], len(points) - 1
    while i >= 0 and holds(points[i][1]):
        start, i = points[i][0], i - 1
    if held_before is not None and not any(v >= held_before for _, v in points[: i + 1]):
        return None
    return start


def _last_words(host: HostSignals) -> tuple[LogLine, ...]:
    """The fatal lines a host's log ended with: its last fatal burst, with no other line after it (a rank restarted
    by its launcher writes on, and so does one that caught its exception), nor one saying right after it that the job
    goes on (fairseq's `skipping batch` after a CUDA out-of-memory line it caught: `_went_on`)."""
    lines = [line for line in host.error_lines if fatal(line)]
    if not lines:
        return ()
    newest = lines[-1].t
    spoke = newest_line_t(host)
    if (spoke is not None and spoke > newest + LAST_WORDS_S) or _went_on(host, lines[-1]):
        return ()
    return tuple(line for line in lines if line.t >= newest - FATAL_BURST_S)


def _went_on(host: HostSignals, newest: LogLine) -> bool:
    """Whether a line of the host's tail after its newest fatal line says the job goes on (`log_patterns.survives`:
    a skipped batch, a retry, an ignored error): the fatal line was an error it caught, not its last words."""
    tail = host.log_tail
    same = (newest.t, newest.message)
    after = next((i + 1 for i in range(len(tail) - 1, -1, -1) if (tail[i].t, tail[i].message) == same), None)
    later = tail[after:] if after is not None else tuple(line for line in tail if line.t > newest.t)
    return any(log_patterns.survives(line.message) for line in later)


def _said_t(host: HostSignals, words: tuple[LogLine, ...]) -> float | None:
    """The host's newest line but its fatal last words (from its tail; None if the tail holds no other)."""
    if not words:
        return host.log_last_t
    earlier = [line.t for line in host.log_tail if line.t < words[0].t]
    return max(earlier, default=None)


def _checkpoint_since(host: HostSignals) -> float | None:
    """When the checkpoint the host is writing began: its newest marker is a start and the training wrote no other
    line after it (the agent's own EMF lines say nothing of the loop); the first start after the last end marker."""
    markers = host.marker_lines
    if not markers or markers[-1].marker != log_patterns.CHECKPOINT_START:
        return None
    newest = markers[-1].t
    ordinary = [line for line in host.log_tail if line.marker is None and not log_patterns.agent_window(line.message)]
    if any(line.t > newest + LAST_WORDS_S for line in ordinary):
        return None
    # The first start line of this checkpoint: back over start lines no further apart than MARKER_RUN_S (a line per
    # shard written), and never before an ordinary line of the tail.
    boundary = max((line.t for line in ordinary if line.pattern is None and line.t < newest), default=-math.inf)
    start = newest
    for line in reversed(markers):
        if line.marker != log_patterns.CHECKPOINT_START or line.t <= boundary or start - line.t > MARKER_RUN_S:
            break
        start = line.t
    return start


def _checkpoint_ended(host: HostSignals) -> float | None:
    markers = host.marker_lines
    return markers[-1].t if markers and markers[-1].marker == log_patterns.CHECKPOINT_END else None


# --- job-level evidence ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Death:
    """Conclusive evidence that the job can no longer progress: what it is, since when, on which hosts, and why."""

    diagnosis: Diagnosis
    onset: float
    confirm_s: float  # it decides once `onset + confirm_s` has passed with no progress since
    hosts: tuple[str, ...]
    reasons: tuple[str, ...]
    lines: dict[str, list[LogLine]]
    conclusive: bool = True  # False: the processes ended by themselves (idleness), the user's idle_minutes decide


def bursts(times: Iterable[float]) -> tuple[float, ...]:
    """Fatal bursts' first lines, oldest first, those closer than `FATAL_BURST_S` to an earlier one being one."""
    kept: list[float] = []
    for t in sorted(times):
        if not kept or t - kept[-1] > FATAL_BURST_S:
            kept.append(t)
    return tuple(kept)


def crash_loop(
    signals: JobSignals, hosts: dict[str, Host], seen: Iterable[float], thresholds: Thresholds, now: float
) -> Death | None:
    """Ranks that die the same way on every restart of their launcher: `CRASH_LOOP_DEATHS` bursts of fatal last words
    within `CRASH_LOOP_WINDOW_S` (`seen`: those earlier decisions saw, with the hosts' own now), every GPU host's
    memory fallen below half its working level since the first (the processes exited, then loaded again), and no
    GPU busy since: nothing trained between the deaths. Conclusive a period after its third burst; a later burst,
    its words fresh at its wake-up, never sets that back (a loop faster than the grace would never be stopped)."""
    found = bursts([*seen, *(t for h in hosts.values() if (t := h.last_words_t) is not None)])
    recent = [t for t in found if t >= now - CRASH_LOOP_WINDOW_S]
    gpu_hosts = [h for name, h in signals.hosts.items() if signals.facts.gpus_on(name)]
    if len(recent) < CRASH_LOOP_DEATHS or not gpu_hosts:
        return None
    first, newest = recent[0], recent[-1]
    for host in gpu_hosts:
        memory, util = gpu_memory(host), gpu_util(host)
        working = memory.between(-math.inf, first).values()
        after = memory.between(first + 1e-6, now).values()
        if not working or not after or min(after) > statistics.median(working) / 2:
            return None  # its processes never let go: no restart (a checkpoint's retries, say)
        if any(v >= thresholds.busy_gpu_percent for v in util.between(first + 1e-6, now).values()):
            return None  # it trained again in between
    lines = {n: list(h.last_words) for n, h in hosts.items() if h.last_words}
    reason = (
        f"a crash loop: fatal last words {len(recent)} times in {_ago(newest, first)}, each after its launcher "
        f"restarted the ranks; every host's processes let go of their GPUs since the first, and none trained again"
    )
    return Death(
        Diagnosis.CRASHED_RANK,
        first,
        recent[CRASH_LOOP_DEATHS - 1] + ALL_FATAL_CONFIRM_S - first,
        tuple(sorted(lines)),
        (reason,),
        lines,
    )


def vanished(hosts: dict[str, Host], period: float, now: float) -> dict[str, float]:
    """Hosts with no datapoint for `VANISHED_PERIODS` periods while another host's newest is at most `FRESH_PERIODS`
    old (so a CloudWatch delay or a job-wide outage is never taken for a lost host): host -> its newest datapoint."""
    fresh = [
        h for h in hosts.values() if h.newest_data_t is not None and now - h.newest_data_t <= FRESH_PERIODS * period
    ]
    if not fresh:
        return {}
    return {
        name: h.newest_data_t
        for name, h in hosts.items()
        if h.newest_data_t is not None and now - h.newest_data_t > VANISHED_PERIODS * period
    }


def death(
    hosts: dict[str, Host],
    last_step_t: float | None,
    training_since: float,
    thresholds: Thresholds,
    limits: Limits,
    period: float,
    now: float,
) -> list[Death]:
    """Evidence that the job can no longer progress, most specific first: fatal last words on every host (NCCL
    watchdog timeouts after a hang) that the GPUs confirm (`_gpus_witness`), ranks whose last words were fatal and
    whose GPUs died with them, hosts that vanished, a host whose processes let go of its GPUs while the others hold
    theirs (all conclusive), or every process gone from its GPUs without a fatal line (idleness: after the agreement
    rung of `idle_minutes`). A printed line is never evidence alone: each death here rests on a witness the job's
    printing cannot supply (its GPUs, its metrics gone).

    `last_step_t`: the agent's last step (None without the agent): fatal lines before it are old news, and the
    evidence without a fatal line needs no step since. Without the agent, that evidence needs the logs silent since
    (but for fatal last words, which are no progress); so do GPUs let go of everywhere, with the agent too (a
    launcher that restarts its ranks writes lines). A rank's fatal last words with its GPUs dead need nothing more,
    whatever the other hosts' logging habits."""
    confirm = limits.crash_s
    after = last_step_t if last_step_t is not None else training_since
    gpu_hosts = {n: h for n, h in hosts.items() if h.gpus}
    gone = vanished(gpu_hosts, period, now)
    last_line_t = said_t(hosts)
    found: list[Death] = []

    def still(onset: float, logs_too: bool = False) -> bool:
        """No progress since the metric-borne evidence at `onset` (a datapoint is stamped at its period's start)."""
        by = onset + period + LAST_WORDS_S
        steps = last_step_t is None or last_step_t <= by
        silent = last_line_t is None or last_line_t <= by
        return steps and (silent if logs_too or last_step_t is None else True)

    spoke = {n: h for n, h in gpu_hosts.items() if h.last_words_t is not None and h.last_words_t >= after}
    dead = {n: h for n, h in spoke.items() if _died_with_it(h, gpu_hosts, gone, thresholds, period)}
    witness = _gpus_witness(gpu_hosts, dead, gone, thresholds)
    if gpu_hosts and len(spoke) == len(gpu_hosts) and witness is not None:
        # Words printed everywhere are still words (an epoch-end warning every rank prints): the GPUs must agree.
        lines = {n: list(h.last_words) for n, h in spoke.items()}
        patterns = {fatal(line) for ls in lines.values() for line in ls}
        diagnosis = Diagnosis.HANG if patterns == {log_patterns.NCCL_TIMEOUT} else Diagnosis.CRASHED_RANK
        onset = max(ls[0].t for ls in lines.values())
        what = "NCCL watchdog timeouts" if diagnosis is Diagnosis.HANG else "fatal lines"
        reason = f"{what} are the last words of all {_count(gpu_hosts)}, and {witness}"
        found.append(Death(diagnosis, onset, ALL_FATAL_CONFIRM_S, tuple(sorted(spoke)), (reason,), lines))
    if dead:
        lines = {n: list(h.last_words) for n, h in dead.items()}
        patterns = {fatal(line) for ls in lines.values() for line in ls}
        diagnosis = Diagnosis.HANG if patterns == {log_patterns.NCCL_TIMEOUT} else Diagnosis.CRASHED_RANK
        onset = min(h.last_words_t for h in dead.values() if h.last_words_t is not None)
        reason = f"{_names(dead)}: fatal last words, then its GPUs went idle, let go of their memory or vanished"
        found.append(Death(diagnosis, onset, confirm, tuple(sorted(dead)), (reason,), lines))
    lost = {n: t for n, t in gone.items() if still(t)}
    if lost:
        onset = min(lost.values())
        reason = f"{_names(lost)} vanished: no metric from it for {_ago(now, onset)} while the others report"
        found.append(Death(Diagnosis.CRASHED_RANK, onset, confirm, tuple(sorted(lost)), (reason,), {}))
    released = {n: h.released_since for n, h in gpu_hosts.items() if h.released_since is not None}
    if gpu_hosts and len(released) == len(gpu_hosts) and all(h.idle_since is not None for h in gpu_hosts.values()):
        onset = max(t for t in released.values() if t is not None)
        if still(onset, logs_too=True):
            # Without a fatal line (that is a death, above) every process ended by itself: a box idle between runs,
            # kept for the user's `idle_minutes` (its agreement rung: memory, utilization and logs agree).
            wait = thresholds.agreement_fraction * limits.idle_s
            reason = (
                f"every process left its GPUs on all {_count(gpu_hosts)}: memory released, utilization idle, "
                f"no fatal line (idle after {wait / 60:.1f} min: {thresholds.agreement_fraction:.2g} of idle_minutes)"
            )
            found.append(Death(Diagnosis.IDLE, onset, wait, tuple(sorted(gpu_hosts)), (reason,), {}, conclusive=False))
    holding = [
        n for n, h in gpu_hosts.items() if n not in released and (h.memory_now or 0.0) >= thresholds.idle_gpu_percent
    ]
    if released and holding and all(still(t) for t in released.values() if t is not None):
        onset = min(t for t in released.values() if t is not None)
        reason = f"{_names(released)}: its processes let go of the GPUs while the others still hold theirs"
        found.append(Death(Diagnosis.CRASHED_RANK, onset, confirm, tuple(sorted(released)), (reason,), {}))
    return found


def _gpus_witness(
    hosts: dict[str, Host], dead: dict[str, Host], gone: dict[str, float], thresholds: Thresholds
) -> str | None:
    """What the GPUs say that no printed line can: a speaking host's GPUs died with its words, a host vanished, every
    process let go of its GPUs, or a collective spins on every host (busy, power fallen); None when they say none."""
    if dead:
        return f"{_names(dead)}'s GPUs died with them"
    if gone:
        return f"{_names(gone)} vanished"
    if hosts and all(h.released_since is not None for h in hosts.values()):
        return "every process let go of its GPUs"
    if spinning(hosts, thresholds):
        return "a collective spins on every host (GPUs busy, power fallen)"
    return None


def said_t(hosts: dict[str, Host]) -> float | None:
    """The job's newest line that is no host's fatal last words: when its printing last showed life."""
    return max((t for h in hosts.values() if (t := h.said_t) is not None), default=None)


def _died_with_it(
    host: Host, hosts: dict[str, Host], gone: dict[str, float], thresholds: Thresholds, period: float
) -> bool:
    """The host's GPUs agree with its fatal last words: memory let go, metrics vanished, or utilization idle while
    another host's GPUs still work (a collective spinning on them counts)."""
    t = host.last_words_t or 0.0
    if host.name in gone and gone[host.name] >= t - period:
        return True
    if host.released_since is not None and host.released_since <= t + 2 * period:
        return True
    idle = thresholds.idle_gpu_percent
    others_work = any(h.util_now is not None and h.util_now >= idle for n, h in hosts.items() if n != host.name)
    return host.idle_since is not None and host.idle_since <= t + 2 * period and others_work


def spinning(hosts: dict[str, Host], thresholds: Thresholds) -> bool:
    """A collective spins on every host: GPU utilization at or above `busy_gpu_percent` on each, and GPU power below
    its baseline on each that reports it (most do): the signature of an NCCL hang. Three signals agreeing: an
    `agreement_fraction` of 1 (the evidence ladder off) turns it off."""
    if thresholds.agreement_fraction >= 1:
        return False
    gpu_hosts = [h for h in hosts.values() if h.gpus]
    if not gpu_hosts or any(h.util_now is None or h.util_now < thresholds.busy_gpu_percent for h in gpu_hosts):
        return False
    reporting = [h for h in gpu_hosts if h.reports_power]
    return len(reporting) >= POWER_REPORTING_SHARE * len(gpu_hosts) and all(h.power_dropped for h in reporting)


def checkpoint_since(hosts: dict[str, Host], progress_since: float, slack_s: float = LAST_WORDS_S) -> float | None:
    """When an undeclared checkpoint began that some host is still writing (its start line at most `slack_s` before
    the last progress, nothing since on its host), else None."""
    starts = [h.checkpoint_since for h in hosts.values() if h.checkpoint_since is not None]
    starts = [t for t in starts if t >= progress_since - slack_s]
    return min(starts, default=None)


def checkpoint_ended(hosts: dict[str, Host], progress_since: float) -> float | None:
    """When the newest checkpoint that ended after the last progress ended (a host's end line), else None."""
    ends = [h.checkpoint_ended for h in hosts.values() if h.checkpoint_ended is not None]
    return max((t for t in ends if t > progress_since), default=None)


def _names(hosts: Iterable[str]) -> str:
    names = sorted(hosts)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _count(hosts: dict[str, Host]) -> str:
    return "1 host" if len(hosts) == 1 else f"{len(hosts)} hosts"


def _ago(now: float, t: float) -> str:
    return f"{(now - t) / 60:.1f} min"
