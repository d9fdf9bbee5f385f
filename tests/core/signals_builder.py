"""A builder for `JobSignals` test fixtures: a job, its hosts, the agent's metrics and the logs, on a time grid.

    signals = (
        SignalsBuilder(hosts=2)
        .progress(0, 3600, step_time=1.0)  # the agent: steps every window for the first hour
        .no_progress(3600, 5400)  # then none (Steps=0, LastStepAge growing)
        .gpu(0, 5400, 99.0)  # every host's GPUs busy throughout
        .build(now=5400)
    )

Times are seconds since the job started (`start_time` 0). Only datapoints at or before `now` are kept.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Platform, Series

WINDOW_S = 60.0  # the agent's emission window and CloudWatch's 1-minute period


def _grid(start: float, end: float, every: float) -> Iterable[float]:
    """Window ends in (start, end]."""
    t = start + every
    while t <= end + 1e-9:
        yield t
        t += every


@dataclass
class SignalsBuilder:
    """Accumulates datapoints and log lines; `build(now)` cuts them at `now`."""

    hosts: int = 1
    platform: Platform = Platform.SAGEMAKER
    name: str = "train-job-1"
    status: str = "InProgress"
    secondary_status: str | None = "Training"
    training_at: float = 0.0  # when the secondary status became Training
    gpus_per_host: int = 8
    tags: dict[str, str] = field(default_factory=dict)
    host_types: dict[str, str] = field(default_factory=dict)  # a heterogeneous cluster's hosts and their types
    _job: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    _host_agent: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    _gpu: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    _memory: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    _power: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    _logs: dict[str, list[LogLine]] = field(default_factory=lambda: defaultdict(list))
    _sweeps: list[float] = field(default_factory=list)
    _stacks: list[LogLine] = field(default_factory=list)
    _step: float = 0.0
    _last_step_t: float | None = None

    def __post_init__(self) -> None:
        if self.platform is Platform.EC2:
            self.secondary_status = None

    @property
    def host_names(self) -> list[str]:
        if self.platform is Platform.EC2:
            return [f"i-{n:017x}" for n in range(1, self.hosts + 1)]
        return [f"algo-{n}" for n in range(1, self.hosts + 1)]

    def _pick(self, hosts: Iterable[str] | None) -> list[str]:
        return list(hosts) if hosts is not None else self.host_names

    # --- the agent ------------------------------------------------------------------------------------------------

    def progress(self, start: float, end: float, step_time: float = 1.0, every: float = WINDOW_S) -> SignalsBuilder:
        """The agent reports steps completing every `step_time` seconds from `start` to `end`."""
        for t in _grid(start, end, every):
            # Steps complete at start + k * step_time; count those in the window (t - every, t].
            last_k = math.floor((t - start) / step_time + 1e-9)
            done = last_k - max(0, math.floor((t - every - start) / step_time + 1e-9))
            self._step += done
            if done:
                self._last_step_t = start + last_k * step_time
                self._job["StepTime"].append((t, step_time))
            self._emit_progress(t, done)
        return self

    def no_progress(self, start: float, end: float, every: float = WINDOW_S) -> SignalsBuilder:
        """The agent keeps emitting (its sampler thread lives) but no step completes: Steps=0, LastStepAge grows."""
        for t in _grid(start, end, every):
            self._emit_progress(t, 0)
        return self

    def _emit_progress(self, t: float, steps: int) -> None:
        self._job["Steps"].append((t, float(steps)))
        self._job["Step"].append((t, self._step))
        self._job["LastStepAge"].append((t, t - (self._last_step_t if self._last_step_t is not None else 0.0)))

    def agent(self, name: str, start: float, end: float, value: float, every: float = WINDOW_S) -> SignalsBuilder:
        """Any job-level agent metric (DataWaitFraction, NonFiniteLoss, PhaseBudgetRemaining, ...) at a constant."""
        self._job[name].extend((t, value) for t in _grid(start, end, every))
        return self

    def phase(self, start: float, budget_s: float, end: float, every: float = WINDOW_S) -> SignalsBuilder:
        """A declared phase from `start` with `budget_s`: PhaseBudgetRemaining counts down, then 0; no steps."""
        for t in _grid(start, end, every):
            self._job["PhaseBudgetRemaining"].append((t, max(0.0, start + budget_s - t)))
            self._emit_progress(t, 0)
        return self

    def host_metric(
        self,
        name: str,
        start: float,
        end: float,
        value: float,
        hosts: Iterable[str] | None = None,
        every: float = WINDOW_S,
    ) -> SignalsBuilder:
        """One of the agent's per-host metrics (Heartbeat, GPUUtilization, ...) at a constant."""
        for host in self._pick(hosts):
            self._host_agent[host, name].extend((t, value) for t in _grid(start, end, every))
        return self

    def power(
        self, start: float, end: float, watts: float, hosts: Iterable[str] | None = None, every: float = WINDOW_S
    ) -> SignalsBuilder:
        """The agent's per-host GPUPowerWatts."""
        return self.host_metric("GPUPowerWatts", start, end, watts, hosts, every)

    # --- the platform -----------------------------------------------------------------------------------------------

    def gpu(
        self, start: float, end: float, percent: float, hosts: Iterable[str] | None = None, every: float = WINDOW_S
    ) -> SignalsBuilder:
        """Host GPU utilization, per device (the sources normalize SageMaker's 0-100 x GPUs)."""
        for host in self._pick(hosts):
            self._gpu[host].extend((t, percent) for t in _grid(start, end, every))
        return self

    def gpu_memory(
        self, start: float, end: float, percent: float, hosts: Iterable[str] | None = None, every: float = WINDOW_S
    ) -> SignalsBuilder:
        """Host GPU memory utilization, per device."""
        for host in self._pick(hosts):
            self._memory[host].extend((t, percent) for t in _grid(start, end, every))
        return self

    def gpu_power(
        self, start: float, end: float, watts: float, hosts: Iterable[str] | None = None, every: float = WINDOW_S
    ) -> SignalsBuilder:
        """Host GPU power per device from the platform (EC2: the CloudWatch agent's power_draw)."""
        for host in self._pick(hosts):
            self._power[host].extend((t, watts) for t in _grid(start, end, every))
        return self

    # --- logs -------------------------------------------------------------------------------------------------------

    def log(self, t: float, message: str, host: str | None = None) -> SignalsBuilder:
        """One log line on `host` (default: the first host)."""
        host = host or self.host_names[0]
        self._logs[host].append(LogLine.read(t, f"{self.name}/{host}-1700000000", message))
        return self

    def logs(
        self,
        start: float,
        end: float,
        every: float,
        message: str = "step done loss 2.31",
        hosts: Iterable[str] | None = None,
    ) -> SignalsBuilder:
        """A line every `every` seconds on each host in (start, end]."""
        for host in self._pick(hosts):
            for t in _grid(start, end, every):
                self.log(t, message, host)
        return self

    def sweeps(self, start: float, end: float, every: float = 300.0) -> SignalsBuilder:
        """The sweeper publishes each host's LogIdleSeconds every `every` seconds (from all its lines so far)."""
        self._sweeps.extend(_grid(start, end, every))
        return self

    def _log_idle(self, host: str, now: float) -> Series:
        times = sorted(line.t for line in self._logs[host])
        points = []
        for t in sorted(s for s in self._sweeps if s <= now):
            seen = [x for x in times if x <= t]
            if seen:
                points.append((t, t - seen[-1]))
        return Series(tuple(points))

    def stacks(self, lines: Iterable[tuple[float, str]], host: str | None = None) -> SignalsBuilder:
        """The agent's stack dump lines (t, message) on `host`'s stream, as the sources read them for a decision."""
        host = host or self.host_names[0]
        self._stacks.extend(LogLine.read(t, f"{self.name}/{host}-1700000000", message) for t, message in lines)
        return self

    # --- the snapshot -----------------------------------------------------------------------------------------------

    def facts(self) -> JobFacts:
        history = () if self.secondary_status is None else ((self.training_at, "Training"),)
        return JobFacts(
            name=self.name,
            platform=self.platform,
            status=self.status,
            secondary_status=self.secondary_status,
            start_time=0.0,
            instance_type="ml.p4d.24xlarge" if self.platform is Platform.SAGEMAKER else "p4d.24xlarge",
            instance_count=self.hosts,
            gpus_per_host=self.gpus_per_host,
            vcpus_per_host=96,
            tags=dict(self.tags),
            status_history=history if self.secondary_status == "Training" else (),
            instance_ids=tuple(self.host_names) if self.platform is Platform.EC2 else (),
            host_types=dict(self.host_types),
        )

    def build(self, now: float) -> JobSignals:
        def cut(points: list[tuple[float, float]]) -> Series:
            return Series(tuple(sorted(p for p in points if p[0] <= now)))

        hosts = {}
        for host in self.host_names:
            lines = sorted((line for line in self._logs[host] if line.t <= now), key=lambda line: line.t)
            agent = {name: cut(points) for (h, name), points in self._host_agent.items() if h == host}
            hosts[host] = HostSignals(
                host=host,
                gpu_util=cut(self._gpu[host]),
                gpu_mem_util=cut(self._memory[host]),
                gpu_power=cut(self._power[host]),
                agent=agent,
                log_last_t=lines[-1].t if lines else None,
                log_tail=tuple(lines[-20:]),
                error_lines=tuple(line for line in lines if line.pattern)[-10:],
                marker_lines=tuple(line for line in lines if line.marker)[-10:],
                log_idle=self._log_idle(host, now),
            )
        return JobSignals(
            facts=self.facts(),
            now=now,
            hosts=hosts,
            agent={name: cut(p) for name, p in self._job.items()},
            stacks=tuple(line for line in self._stacks if line.t <= now),
        )
