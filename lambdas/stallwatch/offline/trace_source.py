"""Signals from a trace file: the `SignalSource` the replay decides on, in place of AWS.

    source = TraceSource(load_trace("corpus/traces/sm-hang-8host.jsonl"))
    signals = source.job_signals(source.job_name, now=source.epoch(3600))

It shows the engine what `aws.source` would at the same moment: datapoints aggregated into the same
1-minute periods with the same statistics, the same lookback, per-device platform metrics, the agent's
metrics, per-host log freshness and tails with fatal-error lines, the sweeper's `LogIdleSeconds` as the replay
publishes them (`publish_log_idle`), the agent's stack dumps since the last step when it shows none
(`core.stack_dumps`), and the secondary status history.
Trace time ``t`` (seconds since InProgress) maps to epoch seconds as ``TRACE_EPOCH + t``.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping

from stallwatch.core import alarms, contract, stack_dumps
from stallwatch.core.evaluator import MetricKey, metric_key
from stallwatch.core.platforms import describe
from stallwatch.core.reading import (
    AGENT_STATISTICS,
    ERROR_LINES_PER_HOST,
    LOG_LINES_PER_HOST,
    LOG_TAIL_SECONDS,
    LOOKBACK_SECONDS,
    METRIC_PERIOD_SECONDS,
    host_period,
)
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, JobStatus, LogLine, Series
from stallwatch.core.trace import EndEvent, Event, LogEvent, MetricEvent, StatusEvent, Trace, TraceHeader

# Trace t = 0 (the job entered InProgress) is this epoch second; the corpus's stream names use it too.
TRACE_EPOCH = 1_700_000_000.0


_AGGREGATES: dict[str, Callable[[list[float]], float]] = {"Sum": sum, "Maximum": max, "Minimum": min}


def _aggregate(statistic: str, values: list[float]) -> float:
    return _AGGREGATES[statistic](values) if statistic in _AGGREGATES else sum(values) / len(values)


class _Points:
    """Sorted (t, value) datapoints with bisect slicing, and their whole periods aggregated once per (statistic,
    period): a replay reads the same periods at every decision."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.values: list[float] = []
        self._periods: dict[tuple[str, int], tuple[int, list[float], list[float]]] = {}

    def window(self, start: float, end: float) -> tuple[list[float], list[float]]:
        lo, hi = bisect.bisect_left(self.times, start), bisect.bisect_right(self.times, end)
        return self.times[lo:hi], self.values[lo:hi]

    def insert(self, t: float, value: float) -> None:
        at = bisect.bisect_right(self.times, t)
        self.times.insert(at, t)
        self.values.insert(at, value)
        self._periods.clear()

    def periods(self, start: float, end: float, statistic: str, divisor: float, period: int) -> Series:
        """The datapoints in [start, end) aggregated into `period`-second periods stamped at their start, as
        GetMetricData answers (a period cut by `start` holds only the datapoints after it)."""
        times, values = self._whole(statistic, period)
        first = math.floor(start / period) * period if math.isfinite(start) else -math.inf
        head_times, head_values = self.window(start, min(first + period, end) - 1e-9)
        points = [(first, _aggregate(statistic, head_values))] if head_times and math.isfinite(first) else []
        lo = bisect.bisect_left(times, first + period)
        hi = bisect.bisect_left(times, end)
        points += zip(times[lo:hi], values[lo:hi], strict=True)
        if divisor != 1.0:
            return Series(tuple((t, v / divisor) for t, v in points))
        return Series(tuple(points))

    def _whole(self, statistic: str, period: int) -> tuple[list[float], list[float]]:
        """Every whole period's aggregate, computed once and extended as datapoints arrive."""
        key = (statistic, period)
        done, starts, aggregates = self._periods.get(key, (0, [], []))
        if done < len(self.times):
            buckets: dict[float, list[float]] = defaultdict(list)
            redo = starts.pop() if starts else None  # the last period may gain datapoints
            if redo is not None:
                aggregates.pop()
                done = bisect.bisect_left(self.times, redo)
            for t, v in zip(self.times[done:], self.values[done:], strict=True):
                buckets[math.floor(t / period) * period].append(v)
            for bucket_start, vs in sorted(buckets.items()):
                starts.append(bucket_start)
                aggregates.append(_aggregate(statistic, vs))
            self._periods[key] = (len(self.times), starts, aggregates)
        return starts, aggregates


class TraceSource:
    """`SignalSource` over one trace; `now` is epoch seconds (``TRACE_EPOCH + t``). `lookback`: how far back the
    signals reach, AWS's reads' by default (``math.inf``: the whole trace, as a chart shows it)."""

    def __init__(self, trace: Trace, epoch: float = TRACE_EPOCH, lookback: float = LOOKBACK_SECONDS) -> None:
        self._index(trace.header, trace.events, trace.source, epoch, lookback)

    @classmethod
    def streamed(
        cls,
        header: TraceHeader,
        events: Iterable[Event],
        source: str = "<trace>",
        epoch: float = TRACE_EPOCH,
        lookback: float = LOOKBACK_SECONDS,
    ) -> TraceSource:
        """The source of a trace read one event at a time (`scan_trace`): no event is kept, only what the
        signals read (a 24-hour, 64-host trace is half a million events)."""
        built = cls.__new__(cls)
        built._index(header, events, source, epoch, lookback)
        return built

    def _index(self, header: TraceHeader, events: Iterable[Event], source: str, epoch: float, lookback: float) -> None:
        self.header = header
        self.lookback = lookback
        self.source_name = source
        self.base = epoch
        self.job = header.job
        self.job_name = self.job.name
        self._layout = self._facts_at(JobStatus.RUNNING, None, ())  # the hosts and their devices, fixed for the trace
        self._platform_description = describe(self.job.platform)
        self.hosts = alarms.host_names(self._layout)
        self.host_period = host_period(
            len(self.hosts), METRIC_PERIOD_SECONDS, self._platform_description.host_series_read
        )
        self._metrics: dict[MetricKey, _Points] = defaultdict(_Points)
        self._logs: dict[str, list[LogLine]] = {host: [] for host in self.hosts}
        self._log_times: dict[str, list[float]] = {host: [] for host in self.hosts}
        self._stacks: list[LogLine] = []  # the agent's stack dumps, every host's, in time order
        self._statuses: list[tuple[float, JobStatus, str | None]] = []
        self.end: float | None = None
        self.last_t = 0.0  # trace time of the last event (the trace's duration)
        keys: dict[tuple[str, str, tuple[tuple[str, str], ...]], MetricKey] = {}
        for event in events:
            t = self.epoch(event.t)
            self.last_t = event.t
            if isinstance(event, MetricEvent):
                m = event.metric
                raw = (m.namespace, m.name, tuple(m.dimensions.items()))
                key = keys.get(raw) or keys.setdefault(raw, metric_key(m.namespace, m.name, m.dimensions))
                points = self._metrics[key]
                points.times.append(t)
                points.values.append(m.value)
            elif isinstance(event, LogEvent):
                host = self.host_of_stream(event.log.stream)
                if host is not None:
                    line = LogLine.read(t, event.log.stream, event.log.message)
                    self._logs[host].append(line)
                    self._log_times[host].append(t)
                    if contract.STACKS_MARKER in line.message:
                        self._stacks.append(line)
            elif isinstance(event, StatusEvent):
                self._statuses.append((t, event.status, event.secondary))
            elif isinstance(event, EndEvent):
                self.end = t

    def metric_points(self) -> Iterator[tuple[MetricKey, list[float], list[float]]]:
        """Every metric's datapoints: (key, epoch times, values), sorted by time; the lists are the source's own."""
        for key, points in self._metrics.items():
            yield key, points.times, points.values

    def log_lines(self) -> list[LogLine]:
        """Every host's log lines, in time order."""
        return sorted((line for lines in self._logs.values() for line in lines), key=lambda line: line.t)

    def status_times(self) -> list[tuple[float, JobStatus]]:
        """(epoch seconds, status) of every status change, in order."""
        return [(t, status) for t, status, _ in self._statuses]

    def epoch(self, t: float) -> float:
        """Epoch seconds of trace time `t`."""
        return self.base + t

    def host_of_stream(self, stream: str) -> str | None:
        """The host a log stream belongs to, as its platform names streams (SageMaker's ``<job>/algo-N-<epoch>``, on
        EC2 the instance id: ``i-...`` or ``i-.../<file>``, as the CloudWatch agent names them); None for others."""
        return self._platform_description.host_of_stream(stream, self.job_name, self._logs)

    def _facts_at(self, status: JobStatus, secondary: str | None, history: tuple[tuple[float, str], ...]) -> JobFacts:
        job = self.job
        return JobFacts(
            name=job.name,
            platform=job.platform,
            status=status,
            secondary_status=secondary,
            start_time=self.base,
            instance_type=job.instance_type,
            instance_count=job.instance_count,
            gpus_per_host=job.gpus_per_host,
            vcpus_per_host=job.vcpus_per_host,
            tags=dict(job.tags),
            status_history=history,
            instance_ids=tuple(job.instance_ids),
            host_types=dict(job.host_types or {}),
            host_instances=dict(job.host_instances or {}),
        )

    def facts(self, now: float) -> JobFacts:
        """The job's status, secondary status and its history as of `now`."""
        seen = [s for s in self._statuses if s[0] <= now]
        status, secondary = (seen[-1][1], seen[-1][2]) if seen else (JobStatus.RUNNING, None)
        history = tuple((t, sec) for t, _, sec in seen if sec is not None)
        return self._facts_at(status, secondary, history)

    def publish_log_idle(self, host: str, now: float, seconds: float) -> None:
        """The sweeper's `LogIdleSeconds` datapoint for `host`, read back with the job's other metrics."""
        dims = {contract.DIM_JOB: self.job_name, contract.DIM_HOST: host}
        self._metrics[metric_key(contract.NAMESPACE, contract.LOG_IDLE_SECONDS, dims)].insert(now, seconds)

    def log_last_t(self, host: str, now: float) -> float | None:
        """The newest log event of `host` at or before `now` (what the sweeper reads as stream freshness)."""
        times = self._log_times.get(host, [])
        i = bisect.bisect_right(times, now)
        return times[i - 1] if i else None

    def _series(
        self,
        key: MetricKey,
        now: float,
        statistic: str = "Average",
        divisor: float = 1.0,
        period: int = METRIC_PERIOD_SECONDS,
    ) -> Series:
        points = self._metrics.get(key)
        if points is None or divisor <= 0:
            return Series()
        # Only periods that have ended by `now` are complete, as in CloudWatch.
        return points.periods(now - self.lookback, math.floor(now / period) * period, statistic, divisor, period)

    def _host_series(self, key: MetricKey, now: float, statistic: str = "Average", divisor: float = 1.0) -> Series:
        """A host's series, at the hosts' period (`reading.host_period`: coarser for a job of very many hosts)."""
        return self._series(key, now, statistic, divisor, self.host_period)

    def _platform(self, host: str, now: float) -> Mapping[str, Series]:
        """The host's platform series, per device, as its platform's description reads them."""

        def read(namespace: str, name: str, dimensions: dict[str, str], divisor: float) -> Series:
            return self._host_series(metric_key(namespace, name, dimensions), now, divisor=divisor)

        return self._platform_description.host_series(self._layout, host, read)

    def _host(self, host: str, now: float, tail_start: float) -> HostSignals:
        host_dims = {contract.DIM_JOB: self.job_name, contract.DIM_HOST: host}
        agent = {
            name: self._host_series(
                metric_key(contract.NAMESPACE, name, host_dims), now, AGENT_STATISTICS.get(name, "Average")
            )
            for name in contract.HOST_METRICS
        }
        lines, times = self._logs.get(host, []), self._log_times.get(host, [])
        upto = bisect.bisect_right(times, now)
        recent = lines[bisect.bisect_left(times, now - self.lookback, hi=upto) : upto]
        # As aws.source reads them: the lines since LOG_TAIL_SECONDS before the quietest host's last event.
        tail_from = bisect.bisect_left(times, tail_start, hi=upto)
        log_idle = metric_key(contract.NAMESPACE, contract.LOG_IDLE_SECONDS, host_dims)
        return HostSignals(
            host=host,
            agent=agent,
            log_last_t=lines[upto - 1].t if upto else None,
            log_tail=tuple(lines[max(tail_from, upto - LOG_LINES_PER_HOST) : upto]),
            error_lines=tuple([line for line in recent if line.pattern][-ERROR_LINES_PER_HOST:]),
            marker_lines=tuple([line for line in recent if line.marker][-ERROR_LINES_PER_HOST:]),
            log_idle=self._host_series(log_idle, now, AGENT_STATISTICS[contract.LOG_IDLE_SECONDS]),
            **self._platform(host, now),
        )

    def job_signals(self, job_name: str, now: float) -> JobSignals:
        """The job as `aws.source` would show it at `now` (epoch seconds)."""
        if job_name != self.job_name:
            raise KeyError(f"trace {self.source_name} holds job {self.job_name!r}, not {job_name!r}")
        job_dims = {contract.DIM_JOB: self.job_name}
        agent = {
            name: self._series(
                metric_key(contract.NAMESPACE, name, job_dims), now, AGENT_STATISTICS.get(name, "Average")
            )
            for name in contract.JOB_METRICS
        }
        lasts = [t for host in self.hosts if (t := self.log_last_t(host, now)) is not None]
        tail_start = min(lasts, default=now) - LOG_TAIL_SECONDS
        return JobSignals(
            facts=self.facts(now),
            now=now,
            hosts={host: self._host(host, now, tail_start) for host in self.hosts},
            agent=agent,
            stacks=self._stacks_since(stack_dumps.dumps_since(agent, now - self.lookback), now),
        )

    def _stacks_since(self, since: float | None, now: float) -> tuple[LogLine, ...]:
        """The dump lines in [since, now], as `aws.stack_dump_reads` reads them (None: not read)."""
        if since is None:
            return ()
        times = [line.t for line in self._stacks]
        return tuple(self._stacks[bisect.bisect_left(times, since) : bisect.bisect_right(times, now)])
