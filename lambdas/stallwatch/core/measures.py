"""What the decision engine measures in a job's signals: the last step and the step interval, log silence and
cadence, trailing runs of GPU utilization, fatal error lines and per-host evidence. Pure: no I/O, no clock.

    limits = measures.Limits.of(policy.thresholds, state.threshold_factor, measures.agent_window(signals.agent))
    logs = measures.log_silence(signals, measures.training_since(signals), policy.thresholds, limits, now)
    silent = logs.silence_s >= logs.threshold_s

Kept whole (over 500 lines): every measure the engine's rules read, one per concern above, over one
`Limits`; the rules import them from one place.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from stallwatch.core import log_patterns
from stallwatch.core.policy import Thresholds
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Series

TRAINING_STATUS = "Training"
STALE_PERIODS = 5  # agent metrics silent for this many periods have vanished
RECENT_PERIODS = 5  # "now" means the last this many periods (a period: the alarm's, or the agent's window if longer)
INTERVAL_SAMPLES = 20  # the adaptive thresholds learn from this many recent intervals
LOG_BURST_S = 1.0  # log lines closer than this are one burst (a traceback, a multi-line report)
LAST_WORDS_S = 30.0  # a fatal burst (the traceback, the launcher's report) is over by then; a line after it is life
LOG_IDLE_SLACK_S = 300.0  # a sawtooth sample's newest line may read this much earlier than the line (its period)
EVIDENCE_ERROR_LINES = 3  # error lines kept per host
EVIDENCE_MESSAGE_CHARS = 300
PROGRESS_METRICS = ("Steps", "Step", "LastStepAge")  # without any of these the agent says nothing about progress
LEARNED_GAP_MARGIN = 1.5  # a log gap the job came back from is normal: silence up to this many times it is too
STRAGGLER_COVERAGE = 0.8  # a straggler's lag is seen in periods spanning at least this share of `straggler_minutes`
STRAGGLER_FLOOR_SHARE = 0.5  # ... each period lagging at least this share of `straggler_ratio`'s excess over 1
STRAGGLER_MIN_HOSTS = 3  # a median of the others needs at least 2 of them
STRAGGLER_MIN_PERIODS = 3  # a straggler lags over at least this many of the hosts' periods
# (metric, whether a higher value lags): a GPU's power is in watts, a NeuronCore's in % of its device's maximum
STRAGGLER_METRICS = (("StepTime", True), ("AcceleratorPowerWatts", False), ("AcceleratorPowerPercent", False))
# The agent's per-host power, by the unit it is in: watts (NVML), else % of the device's maximum (the Neuron driver)
AGENT_POWER = (("AcceleratorPowerWatts", "W"), ("AcceleratorPowerPercent", "%"))
CADENCE_MIN_GAPS = 3  # a host's cadence read from fewer gaps (a rare logger's two lines, 10 s apart) says nothing
HABIT_SPREAD = 3.0  # a host owes a line by its own habit only if none of its gaps exceeds this x their median
RARE_LOGGER_SAMPLES = 2  # lines seen moving less often than every this many sweeper samples: a rare logger
PAUSE_MIN_PERIODS = 2  # a pause shorter than this many periods teaches nothing the thresholds do not allow anyway


@dataclass(frozen=True)
class Limits:
    """The policy's time thresholds in seconds, `threshold_factor` applied."""

    stall_floor_s: float
    idle_s: float
    log_floor_s: float
    startup_s: float
    overrun_s: float
    crash_s: float
    recent_s: float
    stale_s: float
    grace_s: float
    confirmed_grace_s: float  # the grace after conclusive evidence (never more than `grace_s`)
    busy_silence_s: float
    straggler_s: float
    factor: float

    @classmethod
    def of(cls, thresholds: Thresholds, factor: float, agent_window_s: float | None) -> Limits:
        period = max(float(thresholds.alarm_period_seconds), agent_window_s or 0.0)
        return cls(
            stall_floor_s=thresholds.stall_minutes * 60 * factor,
            idle_s=thresholds.idle_minutes * 60 * factor,
            log_floor_s=thresholds.log_silence_minutes * 60 * factor,
            startup_s=thresholds.startup_grace_minutes * 60 * factor,
            overrun_s=thresholds.phase_overrun_minutes * 60 * factor,
            crash_s=thresholds.crash_confirm_minutes * 60 * factor,
            recent_s=RECENT_PERIODS * period,
            stale_s=STALE_PERIODS * period,
            grace_s=thresholds.stop_grace_minutes * 60,
            confirmed_grace_s=min(thresholds.confirmed_grace_minutes, thresholds.stop_grace_minutes) * 60,
            busy_silence_s=thresholds.busy_silence_minutes * 60 * factor,
            straggler_s=thresholds.straggler_minutes * 60,
            factor=factor,
        )

    def for_hosts(self, period: float) -> Limits:
        """These limits for the hosts' series, whose period may be longer than the job's (a 512-host job's: 5
        minutes): "now" and "stale" span as many of their periods."""
        recent_s, stale_s = max(self.recent_s, RECENT_PERIODS * period), max(self.stale_s, STALE_PERIODS * period)
        return replace(self, recent_s=recent_s, stale_s=stale_s)


@dataclass(frozen=True)
class Progress:
    """What the agent says about steps."""

    last_step_t: float | None  # None: no step seen yet
    step: float | None  # the latest global step
    interval_s: float | None  # recent seconds per step
    stall_s: float  # the adaptive stall threshold
    learned_s: float  # the part of it the job taught: k x its step interval, a stall it recovered from
    newest_t: float  # the newest agent datapoint
    fresh: bool


@dataclass(frozen=True)
class Logs:
    """Log silence over all hosts, and the adaptive threshold it is held to."""

    last_t: float | None
    silence_s: float
    interval_s: float | None
    threshold_s: float
    learned_gap_s: float | None  # the longest gap the job came back from (the sweeper's sawtooth, the job's state)


def training_since(signals: JobSignals) -> float:
    """When training began: the latest transition to Training, else the job's start."""
    starts = [t for t, status in signals.facts.status_history if status == TRAINING_STATUS]
    return max(starts) if starts else signals.facts.start_time


def agent_window(agent: dict[str, Series]) -> float | None:
    """The agent's emission window: the median spacing of its progress datapoints."""
    times = max((agent[name].points for name in PROGRESS_METRICS if name in agent), key=len, default=())
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(times)][-INTERVAL_SAMPLES:]
    return statistics.median(gaps) if gaps else None


def progress(
    agent: dict[str, Series],
    thresholds: Thresholds,
    limits: Limits,
    now: float,
    remembered_interval_s: float | None = None,
    recovered_gap_s: float | None = None,
) -> Progress:
    """The last step, the recent step interval (else the one the job's state remembers) and the adaptive stall
    threshold: max(floor, k x interval, LEARNED_GAP_MARGIN x a warned stall the job recovered from); whether the
    agent is fresh."""
    samples = [v for _, v in interval_samples(agent)][-INTERVAL_SAMPLES:]
    # The latest sample too: after steps slow down, the new pace counts at once (it only ever raises the threshold).
    interval = max(statistics.median(samples), samples[-1]) if samples else remembered_interval_s
    learned = max(thresholds.step_interval_factor * (interval or 0.0), LEARNED_GAP_MARGIN * (recovered_gap_s or 0.0))
    stall = max(limits.stall_floor_s, learned * limits.factor)
    newest = max(agent[name].points[-1][0] for name in PROGRESS_METRICS if len(agent.get(name, Series())))
    return Progress(
        last_step_t=_last_step_time(agent),
        step=agent.get("Step", Series()).latest(),
        interval_s=interval,
        stall_s=stall,
        learned_s=learned * limits.factor,
        newest_t=newest,
        fresh=now - newest <= limits.stale_s,
    )


def _step_completions(agent: dict[str, Series]) -> list[tuple[float, float]]:
    """(t, steps completed since the previous completion): where the Step counter rose, else windows with Steps > 0."""
    counter = agent.get("Step", Series()).points
    if counter:
        rises, previous = [], counter[0][1]
        for t, value in counter[1:]:
            if value > previous:
                rises.append((t, value - previous))
            previous = value
        return rises
    return [(t, v) for t, v in agent.get("Steps", Series()).points if v > 0]


def interval_samples(agent: dict[str, Series]) -> list[tuple[float, float]]:
    """(t, seconds per step), oldest first: StepTime where the agent reports it, else from step completions."""
    step_time = [(t, v) for t, v in agent.get("StepTime", Series()).points if v > 0]
    if step_time:
        return step_time
    completions = _step_completions(agent)
    return [(t, (t - t0) / n) for (t0, _), (t, n) in itertools.pairwise(completions)]


def _last_step_time(agent: dict[str, Series]) -> float | None:
    """When the last step completed; None if no step is known."""
    completions = _step_completions(agent)
    stepped = bool(completions) or (agent.get("Step", Series()).latest() or 0) > 0
    if not stepped:
        return None
    age = agent.get("LastStepAge", Series())
    if len(age):
        t, seconds = age.points[-1]
        return t - seconds
    if completions:
        return completions[-1][0]
    return agent["Step"].points[0][0]  # the counter never moved in view: the step is at least this old


def gpu_util(host: HostSignals) -> Series:
    """Per-device utilization: the platform's, else the agent's own reading (NVML, or neuron-monitor's NeuronCores)."""
    return host.gpu_util if len(host.gpu_util) else host.agent_series("AcceleratorUtilization")


def gpu_memory(host: HostSignals) -> Series:
    """Per-device memory utilization: the platform's, else the agent's own reading (NVML, or neuron-monitor's)."""
    return host.gpu_mem_util if len(host.gpu_mem_util) else host.agent_series("AcceleratorMemoryUtilization")


def agent_power(host: HostSignals) -> tuple[Series, str]:
    """The agent's per-device power and its unit: watts (NVML), else % of the device's maximum (a NeuronCore's);
    only ratios of it are read (a drop from its baseline, a host against the others), so either serves."""
    for name, unit in AGENT_POWER:
        series = host.agent_series(name)
        if len(series):
            return series, unit
    return Series(), AGENT_POWER[0][1]


def trailing_run(series: Series, holds: Callable[[float], bool], now: float, stale_s: float) -> float | None:
    """How long `holds` has been true of the newest datapoints, up to now; None if the data is stale or it fails."""
    if not len(series) or now - series.points[-1][0] > stale_s or not holds(series.points[-1][1]):
        return None
    start = series.points[-1][0]
    for t, value in reversed(series.points):
        if not holds(value):
            break
        start = t
    return now - start


def fatal(line: LogLine) -> str | None:
    """The line's fatal-error pattern name (`log_patterns`), else None."""
    return line.pattern or log_patterns.match(line.message)


def errors_since(hosts: dict[str, HostSignals], since: float) -> dict[str, list[LogLine]]:
    """Each host's fatal-error lines at or after `since`."""
    found = {name: [line for line in h.error_lines if line.t >= since and fatal(line)] for name, h in hosts.items()}
    return {name: lines for name, lines in found.items() if lines}


def log_silence(
    signals: JobSignals,
    training_since: float,
    thresholds: Thresholds,
    limits: Limits,
    now: float,
    remembered_gap_s: float | None = None,
) -> Logs:
    """Silence since the newest line on any host, held to max(floor, k x cadence, longest recent gap,
    LEARNED_GAP_MARGIN x the longest gap the job came back from: in the sweeper's sawtooth or `remembered_gap_s`)."""
    hosts = signals.hosts.values()
    lasts = [h.log_last_t for h in hosts if h.log_last_t is not None]
    lasts += [line.t for h in hosts for line in h.log_tail]
    last = max(lasts) if lasts else None
    cadence = min((c for h in hosts if (c := _cadence(h.log_tail)) is not None), default=None)
    interval, longest = cadence if cadence is not None else (None, 0.0)
    gaps = [g for g in (sawtooth_gap(signals.hosts.values()), remembered_gap_s) if g is not None]
    learned_gap = max(gaps, default=None)
    learned = max(
        thresholds.log_interval_factor * (interval or 0.0), longest, LEARNED_GAP_MARGIN * (learned_gap or 0.0)
    )
    return Logs(
        last_t=last,
        silence_s=now - (last if last is not None else training_since),
        interval_s=interval,
        threshold_s=max(limits.log_floor_s, learned * limits.factor),
        learned_gap_s=learned_gap,
    )


def sawtooth_gap(hosts: Iterable[HostSignals]) -> float | None:
    """The longest log gap that ended within the lookback, from the sweeper's `LogIdleSeconds` sawtooth.

    Each sample says when the job's newest line was (sample time - the least idle host's value); where that moves
    on, the logs came back after at most the difference. A 10-minute log tail never holds two bursts of a
    20-minute cadence; the 3-hour sawtooth holds nine. The silence still going on is not a gap yet."""
    return max((b - a for a, _, b in _log_resumptions(hosts)), default=None)


def log_interval(hosts: Iterable[HostSignals], since: float, before: float = math.inf) -> float | None:
    """How often the job logs: its chattiest host's cadence where its tail shows it (`CADENCE_MIN_GAPS` gaps between
    bursts) and the sweeper's sawtooth since `since` (training began: start-up lines are no cadence) does not say it
    logs rarer (its lines seen moving less often than every `RARE_LOGGER_SAMPLES` samples: a launcher's restart writes
    its lines seconds apart in a rare logger's tail); else (a rare logger: a line or two in its tail, two of them maybe
    seconds apart) the longer of that and the median gap of the sawtooth. `before`: the tails' lines before it only
    (a fatal burst's gap after the job's last lines is no habit of its)."""
    hosts = list(hosts)
    tails = {h.host: _burst_gaps(tuple(line for line in h.log_tail if line.t < before)) for h in hosts}
    known = [statistics.median(gaps) for gaps in tails.values() if len(gaps) >= CADENCE_MIN_GAPS]
    resumptions = [(a, s, b) for a, s, b in _log_resumptions(hosts) if a >= since]
    sawtooth = statistics.median(b - a for a, _, b in resumptions) if resumptions else None
    if known and (sawtooth is None or sawtooth <= RARE_LOGGER_SAMPLES * _sample_spacing(hosts)):
        return min(known)
    few = [statistics.median(g) for g in tails.values() if g]
    return max([*few, *([sawtooth] if sawtooth is not None else [])], default=None)


def _sample_spacing(hosts: Iterable[HostSignals]) -> float:
    """How often the sweeper samples the sawtooth (the median time between its samples)."""
    samples = sorted({t for host in hosts for t, _ in host.log_idle.points})
    return statistics.median(b - a for a, b in itertools.pairwise(samples)) if len(samples) > 1 else math.inf


def _log_resumptions(hosts: Iterable[HostSignals]) -> list[tuple[float, float, float]]:
    """(a, s, b) for each time the sawtooth's newest line moved on: the logs were silent from a (a line) to at least
    s (the last sample that still saw it), and spoke again by b (the newest line at the next sample). A silence that
    ended with fatal lines the job has not printed past yet (a watchdog's, after a hang) has not ended."""
    hosts = list(hosts)
    newest: dict[float, float] = {}
    for host in hosts:
        for t, idle in host.log_idle.points:
            newest[t] = max(newest.get(t, -math.inf), t - idle)
    samples = sorted(newest)
    last = max((t for h in hosts if (t := newest_line_t(h)) is not None), default=-math.inf)
    words = [line.t for h in hosts for line in h.error_lines if line.t >= last - LAST_WORDS_S and fatal(line)]
    # A sample's time is its period's start (at most a sweep before its publication): the newest line it saw may
    # read that much earlier than the line itself.
    slack = min(_sample_spacing(hosts), LOG_IDLE_SLACK_S)

    def unanswered(b: float) -> bool:
        return any(t - slack <= b <= t + LOG_BURST_S for t in words)

    return [
        (newest[s], s, newest[t])
        for s, t in itertools.pairwise(samples)
        if newest[t] > newest[s] and not unanswered(newest[t])
    ]


def newest_line_t(host: HostSignals) -> float | None:
    """The host's newest line read (its tail holds the newest); without one, its newest event known (the sweeper's
    freshness: a bound up to a period late, never a line)."""
    return max((line.t for line in host.log_tail), default=host.log_last_t)


def newest_line_before(hosts: Iterable[HostSignals], t: float, period: float) -> float | None:
    """The job's newest log line a period or more before `t`, as the sweeper's sawtooth saw it (beyond the log tail
    a decision reads; a sample's time is its period's start, so a line seen within a period before `t` may be `t`'s)."""
    return max((s - idle for host in hosts for s, idle in host.log_idle.points if s - idle < t - period), default=None)


@dataclass(frozen=True)
class Pauses:
    """The longest pauses the job came back from (no step with the agent, no log line without it), by what its GPUs
    did meanwhile: every GPU busy (an evaluation that logs nothing), or every GPU idle with its memory held (a
    checkpoint, an input stall). Kept across decisions in `JobState`: a pause within `LEARNED_GAP_MARGIN` of one the
    job came back from is normal for it."""

    busy_s: float | None = None  # at least this long (to the last moment it was seen still silent)
    idle_s: float | None = None  # until its GPUs worked again

    def merged(self, other: Pauses) -> Pauses:
        return Pauses(_larger(self.busy_s, other.busy_s), _larger(self.idle_s, other.idle_s))


def _larger(a: float | None, b: float | None) -> float | None:
    return max((v for v in (a, b) if v is not None), default=None)


def pauses(signals: JobSignals, thresholds: Thresholds, period: float) -> Pauses:
    """The longest busy and idle pauses that ended within the lookback. A pause runs from the last progress (a step
    with the agent, else a log line) to the next; its GPUs are read on every GPU host from a period after it began
    to the last moment it was known still paused, and count only if they all did the same throughout."""
    gpu_hosts = [h for name, h in signals.hosts.items() if signals.facts.gpus_on(name)]
    if not gpu_hosts:
        return Pauses()
    busy: list[float] = []
    idle: list[float] = []
    for a, s, b in _progress_gaps(signals, period):
        utils = [gpu_util(h).between(a + period, s + 1e-6).values() for h in gpu_hosts]
        if not all(utils):
            continue
        if all(min(u) >= thresholds.busy_gpu_percent for u in utils):
            busy.append(s - a)
        elif all(max(u) < thresholds.idle_gpu_percent for u in utils) and _memory_held(gpu_hosts, a, s, thresholds):
            idle.append(_working_again(gpu_hosts, s, b, thresholds) - a)
    return Pauses(max(busy, default=None), max(idle, default=None))


def _progress_gaps(signals: JobSignals, period: float) -> list[tuple[float, float, float]]:
    """(a, s, b) for each pause of at least `PAUSE_MIN_PERIODS` periods that ended: progress at a, still none at s,
    progress again by b. The agent's step completions where it reports progress, else the sweeper's log sawtooth."""
    completions = [t for t, _ in _step_completions(signals.agent)]
    if completions:
        window = agent_window(signals.agent) or period
        gaps = [(a, b - window, b) for a, b in itertools.pairwise(completions)]
    else:
        gaps = _log_resumptions(signals.hosts.values())
    return [(a, s, b) for a, s, b in gaps if s - a >= PAUSE_MIN_PERIODS * period]


def _memory_held(hosts: list[HostSignals], start: float, end: float, thresholds: Thresholds) -> bool:
    """Every host's processes held their GPU memory from `start` to `end`."""
    memory = [gpu_memory(h).between(start, end + 1e-6).values() for h in hosts]
    return all(memory) and all(min(m) >= thresholds.idle_gpu_percent for m in memory)


def _working_again(hosts: list[HostSignals], after: float, by: float, thresholds: Thresholds) -> float:
    """When the first GPU worked again after `after` (at most `by`, when progress was seen again)."""
    starts = [t for h in hosts for t, v in gpu_util(h).between(after, by).points if v >= thresholds.idle_gpu_percent]
    return min(starts, default=by)


def straggler_window(limits: Limits, period: float) -> float:
    """How long a straggler must lag: `straggler_minutes`, and at least `STRAGGLER_MIN_PERIODS` of the hosts'
    periods (a 512-host job's are 5 minutes long)."""
    return max(limits.straggler_s, STRAGGLER_MIN_PERIODS * period)


def straggler(
    hosts: dict[str, HostSignals], facts: JobFacts, thresholds: Thresholds, limits: Limits, now: float, period: float
) -> tuple[dict[str, Any] | None, float | None]:
    """One host far from the others of its instance type for `straggler_window`: its StepTime above their median,
    or its GPU power below it, by `straggler_ratio` over the window (the median of its per-period ratios) and by half
    that excess in every period. Evidence: host, metric, ratio, the others' median and every such host's value.
    With none yet, when a host that lags as one does, not yet for the window, will have lagged that long: the moment
    it may be named (None if no host lags). One pass over the ratios gives both."""
    window = straggler_window(limits, period)
    span = min(STRAGGLER_COVERAGE * window, window - 2 * period)  # the newest period may not have landed yet
    due: list[float] = []
    for group in _type_groups(hosts, facts):
        for metric, slow in STRAGGLER_METRICS:
            per_host = _per_host(group, metric, now - window)
            times, ratios_of = _ratios(per_host, slow)
            found = _named(per_host, times, ratios_of, metric, span, thresholds)
            if found is not None:
                return found, None
            due += [t + window for t in _lag_starts(ratios_of, thresholds)]
    return None, min((t for t in due if t > now), default=None)


def _type_groups(hosts: dict[str, HostSignals], facts: JobFacts) -> list[dict[str, HostSignals]]:
    """The hosts by instance type (a heterogeneous cluster's groups draw different power)."""
    groups: dict[str, dict[str, HostSignals]] = {}
    for name, host in hosts.items():
        groups.setdefault(facts.host_types.get(name, facts.instance_type), {})[name] = host
    return list(groups.values())


def _per_host(hosts: dict[str, HostSignals], metric: str, since: float) -> dict[str, dict[float, float]]:
    per_host = {name: dict(h.agent_series(metric).since(since).points) for name, h in hosts.items()}
    return {name: points for name, points in per_host.items() if points}


def _ratios(
    per_host: dict[str, dict[float, float]], slow: bool
) -> tuple[list[float], dict[str, list[tuple[float, float]]]]:
    """The times all hosts report, and each host's (t, ratio to the others' median) at them, up to its first
    unusable value (none below `STRAGGLER_MIN_HOSTS` hosts)."""
    if len(per_host) < STRAGGLER_MIN_HOSTS:
        return [], {}
    times = sorted(set.intersection(*(set(p) for p in per_host.values())))
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in per_host}
    broken: set[str] = set()
    for t in times:
        values = sorted(p[t] for p in per_host.values())
        for name, points in per_host.items():
            if name in broken:
                continue
            others = _median_without(values, points[t])
            if others <= 0 or points[t] <= 0:
                broken.add(name)
                continue
            found[name].append((t, points[t] / others if slow else others / points[t]))
    return times, found


def _median_without(ordered: list[float], value: float) -> float:
    """The median of `ordered` (sorted) without one occurrence of `value`: O(log n), not a sort per host."""
    gone = bisect.bisect_left(ordered, value)
    size = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i if i < gone else i + 1]

    return at(size // 2) if size % 2 else (at(size // 2 - 1) + at(size // 2)) / 2


def _lag_floor(thresholds: Thresholds) -> float:
    """The ratio every period of a straggler's lag exceeds: half of `straggler_ratio`'s excess over 1."""
    return 1 + STRAGGLER_FLOOR_SHARE * (thresholds.straggler_ratio - 1)


def _named(
    per_host: dict[str, dict[float, float]],
    times: list[float],
    ratios_of: dict[str, list[tuple[float, float]]],
    metric: str,
    span: float,
    thresholds: Thresholds,
) -> dict[str, Any] | None:
    """The host that lagged in every period over at least `span`, by `straggler_ratio` at the median, with its
    evidence; None if none did (or the periods do not span long enough)."""
    if not times or times[-1] - times[0] < span:
        return None
    for name, timed in ratios_of.items():
        ratios = [r for _, r in timed]
        if (
            len(ratios) == len(times)
            and min(ratios) > _lag_floor(thresholds)
            and statistics.median(ratios) >= thresholds.straggler_ratio
        ):
            latest = times[-1]
            return {
                "host": name,
                "metric": metric,
                "ratio": round(statistics.median(ratios), 2),
                "others_median": rounded(statistics.median(p[latest] for n, p in per_host.items() if n != name)),
                "values": {n: rounded(p[latest]) for n, p in sorted(per_host.items())},
            }
    return None


def _lag_starts(ratios_of: dict[str, list[tuple[float, float]]], thresholds: Thresholds) -> list[float]:
    """When each host's current run of lagging periods began, for hosts lagging by `straggler_ratio` over it."""
    floor = _lag_floor(thresholds)
    starts = []
    for ratios in ratios_of.values():
        run = list(itertools.takewhile(lambda r: r[1] > floor, reversed(ratios)))
        if run and statistics.median(r for _, r in run) >= thresholds.straggler_ratio:
            starts.append(run[-1][0])
    return starts


def line_owed_s(hosts: Iterable[HostSignals], logs: Logs, limits: Limits, since: float, words_t: float) -> float:
    """How long after its newest line a job owes the next by its own habit: LEARNED_GAP_MARGIN x its logging
    interval (`log_interval`, from `since`, read before the words at `words_t`) or the longest gap it came back from,
    whichever is longer, and at least `crash_confirm_minutes`; with neither known, its log-silence threshold."""
    known = [v for v in (log_interval(hosts, since, words_t), logs.learned_gap_s) if v is not None]
    if not known:
        return logs.threshold_s
    return max(limits.crash_s, LEARNED_GAP_MARGIN * max(known) * limits.factor)


def host_line_owed_s(host: HostSignals, thresholds: Thresholds, limits: Limits) -> float | None:
    """How long after its newest line a host that logs on its own owes the next: k x its cadence (at least
    `crash_confirm_minutes`), read from its tail (at least `CADENCE_MIN_GAPS` gaps between its bursts, none longer
    than `HABIT_SPREAD` x their median). None for a host without a regular habit: a quiet rank that logs only at
    start-up, or at start-up and at an event's line hours later (one gap, however long, is no habit)."""
    gaps = _burst_gaps(host.log_tail)
    if len(gaps) < CADENCE_MIN_GAPS:
        return None
    cadence = statistics.median(gaps)
    if max(gaps) > HABIT_SPREAD * cadence:
        return None
    return max(limits.crash_s, thresholds.log_interval_factor * cadence * limits.factor)


def _cadence(lines: tuple[LogLine, ...]) -> tuple[float, float] | None:
    """(median, longest) gap between one host's recent bursts of lines. The job's cadence is its chattiest host's:
    the job is silent only when every host is, and quiet ranks' old startup lines say nothing about it."""
    gaps = _burst_gaps(lines)
    return (statistics.median(gaps), max(gaps)) if gaps else None


def _burst_gaps(lines: tuple[LogLine, ...]) -> list[float]:
    """The latest gaps between one host's bursts of lines (lines closer than LOG_BURST_S are one burst)."""
    bursts: list[float] = []
    for t in sorted(line.t for line in lines):
        if not bursts or t - bursts[-1] >= LOG_BURST_S:
            bursts.append(t)
    return [b - a for a, b in itertools.pairwise(bursts)][-INTERVAL_SAMPLES:]


def host_evidence(host: HostSignals, since: float, thresholds: Thresholds, limits: Limits, now: float) -> dict:
    """Per host: utilization and power before `since` (the last progress) and now, log freshness, error lines."""
    recent_since = max(since, now - limits.recent_s)
    util = gpu_util(host)
    power, unit = agent_power(host)
    power_before = power.between(float("-inf"), since).values()
    power_baseline = statistics.median(power_before) if power_before else None
    power_now = power.since(recent_since).mean()
    return {
        "gpu_util_before": rounded(util.between(float("-inf"), since).mean()),
        "gpu_util_now": rounded(util.since(recent_since).mean()),
        "power_w_baseline": rounded(power_baseline),
        "power_w_now": rounded(power_now),
        "power_unit": unit,  # "W", or "%" of the device's maximum (a NeuronCore's)
        "power_dropped": (
            power_baseline is not None
            and power_now is not None
            and power_now < thresholds.power_drop_ratio * power_baseline
        ),
        "log_last_t": host.log_last_t,
        "errors": [
            {"t": line.t, "pattern": fatal(line), "message": line.message[:EVIDENCE_MESSAGE_CHARS]}
            for line in [line for line in host.error_lines if fatal(line)][-EVIDENCE_ERROR_LINES:]
        ],
    }


def rounded(value: float | None) -> float | None:
    """An evidence value to 3 decimals."""
    return None if value is None else round(value, 3)
