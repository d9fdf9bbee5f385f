"""What the decision engine sees: typed snapshots of one job, and the source interface.

Two sources implement `SignalSource`: ``aws.source`` (CloudWatch, Logs, SageMaker, EC2)
and ``trace_source`` (a trace file, for replay). Values are already normalized: GPU and
CPU utilization are per device (0-100), times are epoch seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from stallwatch.core import log_patterns
from stallwatch.core.contract import RENAMED_METRICS
from stallwatch.core.pricing import accelerated, instance_spec, neuron

OLD_NAMES = {new: old for old, new in RENAMED_METRICS.items()}  # an agent metric's name before it was renamed


@dataclass(frozen=True)
class Series:
    """Datapoints of one metric, oldest first: ``((t, value), ...)``."""

    points: tuple[tuple[float, float], ...] = ()

    def latest(self) -> float | None:
        return self.points[-1][1] if self.points else None

    def latest_time(self) -> float | None:
        return self.points[-1][0] if self.points else None

    def since(self, t: float) -> Series:
        return Series(tuple(p for p in self.points if p[0] >= t))

    def between(self, start: float, end: float) -> Series:
        return Series(tuple(p for p in self.points if start <= p[0] < end))

    def values(self) -> list[float]:
        return [v for _, v in self.points]

    def mean(self) -> float | None:
        return sum(v for _, v in self.points) / len(self.points) if self.points else None

    def __len__(self) -> int:
        return len(self.points)


class Platform(StrEnum):
    SAGEMAKER = "sagemaker"
    EC2 = "ec2"
    SLURM = "slurm"


class JobStatus(StrEnum):
    """A job's status, on every platform: each adapter maps its platform's words to it (SageMaker's
    TrainingJobStatus, EC2's instance states, Slurm's job states), and nothing above the adapters reads theirs.

    The values are the words traces, audit records and reasons have always carried (SageMaker's, where Stallwatch
    began), so a trace or a record written before reads the same."""

    RUNNING = "InProgress"
    PAUSED = "Paused"  # held out of running by its scheduler (Slurm: pending, suspended, requeued): never a stall
    STOPPING = "Stopping"  # asked to stop; its final status is still to come
    STOPPED = "Stopped"
    COMPLETED = "Completed"
    FAILED = "Failed"

    @property
    def ended(self) -> bool:
        """The platform's final word on the job. Stopping is not one: the status it ends in (Stopped, or Completed
        and Failed where it finished first) follows, and its end event, resume and summary are that status's."""
        return self in (JobStatus.STOPPED, JobStatus.COMPLETED, JobStatus.FAILED)

    @property
    def winding_down(self) -> bool:
        """Ended, or asked to stop: a replay decides it no more (as the sweeper no longer lists it)."""
        return self.ended or self is JobStatus.STOPPING


@dataclass(frozen=True)
class LogLine:
    """One log event; `pattern` names the fatal-error pattern it matched, if any; `marker` the checkpoint marker."""

    t: float
    stream: str
    message: str
    pattern: str | None = None
    marker: str | None = None

    @classmethod
    def read(
        cls, t: float, stream: str, message: str, patterns: log_patterns.LinePatterns = log_patterns.BUILT_IN
    ) -> LogLine:
        """A line as the sources read it: named by its fatal kind or its checkpoint marker (`log_patterns`, with the
        job's own lines where its policy adds some)."""
        return cls(t, stream, message, *patterns.classify(message))


@dataclass(frozen=True)
class JobFacts:
    """What the platform says about the job."""

    name: str
    platform: Platform
    status: JobStatus  # the platform's word, mapped by its adapter (a word of `JobStatus`'s is taken as it)
    secondary_status: str | None  # Starting, Downloading, Training, Uploading, ... (None on EC2)
    start_time: float
    instance_type: str
    instance_count: int
    gpus_per_host: int
    vcpus_per_host: int
    tags: dict[str, str] = field(default_factory=dict)
    # The secondary status transitions seen so far: ((t, status), ...).
    status_history: tuple[tuple[float, str], ...] = ()
    # The hosts where the platform names them: EC2 instance ids, Slurm node names; SageMaker hosts are algo-1..algo-N.
    instance_ids: tuple[str, ...] = ()
    # Each host's instance type where the hosts differ (heterogeneous clusters); else empty: all are instance_type.
    host_types: dict[str, str] = field(default_factory=dict)
    # Why some of the job's tags were not taken as they are (EC2: tags that differ across its instances).
    tag_errors: tuple[str, ...] = ()
    # Where the hosts' logs are (EC2: streams named by instance id); None: the platform's own place.
    log_group: str | None = None
    # What the platform's actions name the job by, beyond its name (Slurm: cluster, job id, submit time, controller).
    platform_ids: dict[str, str] = field(default_factory=dict)
    # Each named host's EC2 instance where the host is not one (a Slurm node on ParallelCluster or PCS): its metrics.
    host_instances: dict[str, str] = field(default_factory=dict)
    # When the platform ends the job itself (Slurm's --time limit); None: never. Past it, the job is not stopped.
    ends_by: float | None = None
    # What the platform itself says of the job, for the alert and the decision (HyperPod's verdict on a node).
    notes: tuple[str, ...] = ()
    # The hosts the platform's own health check blames on the hardware, with its words (HyperPod's health agent's
    # verdict): a way back drains or replaces them (`core.way_back.blamed_hosts`).
    hardware_faults: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobStatus(self.status))

    def gpus_on(self, host: str) -> int:
        """Accelerator devices on `host`: its type's where the hosts differ (none on a CPU-only group's host)."""
        if host not in self.host_types:
            return self.gpus_per_host
        instance_type = self.host_types[host]
        return instance_spec(instance_type).devices if accelerated(instance_type) else 0

    def gpu_host_count(self) -> int:
        """How many of the job's hosts have accelerators (a heterogeneous cluster's CPU-only group has none)."""
        if self.host_types:
            return sum(1 for host in self.host_types if self.gpus_on(host))
        return self.instance_count if self.gpus_per_host else 0

    def neuron(self) -> bool | None:
        """Whether the job's hosts are Neuron ones (Trainium, Inferentia): True, False, or None where no host's type is
        known (a Slurm node that is no EC2 instance of the account)."""
        types = set(self.host_types.values()) or {self.instance_type}
        if types <= {""}:
            return None
        return any(neuron(instance_type) for instance_type in types)

    def vcpus_on(self, host: str) -> int:
        return instance_spec(self.host_types[host]).vcpus if host in self.host_types else self.vcpus_per_host

    def fleet(self) -> dict[str, int]:
        """Instance type -> how many of the job's hosts are of it."""
        if not self.host_types:
            return {self.instance_type: self.instance_count}
        counts: dict[str, int] = {}
        for instance_type in self.host_types.values():
            counts[instance_type] = counts.get(instance_type, 0) + 1
        return counts

    def without_host(self, host: str) -> JobFacts:
        """The job once `host` has left it (a job whose hosts end one by one): fewer hosts, or Stopped when it was
        the last one."""
        if host not in self.instance_ids:
            return self
        hosts = tuple(h for h in self.instance_ids if h != host)
        if not hosts or self.status is not JobStatus.RUNNING:
            return replace(self, status=JobStatus.STOPPED)
        host_types = {h: t for h, t in self.host_types.items() if h != host}
        return replace(self, instance_ids=hosts, instance_count=len(hosts), host_types=host_types)


@dataclass(frozen=True)
class HostSignals:
    """One host: platform metrics, the agent's per-host metrics, and its logs."""

    host: str  # "algo-1" on SageMaker, the instance id on EC2
    gpu_util: Series = Series()  # percent per device
    gpu_mem_util: Series = Series()  # percent per device
    cpu_util: Series = Series()  # percent per vCPU
    gpu_power: Series = Series()  # watts per device, from the platform (EC2: the CloudWatch agent's power_draw)
    agent: dict[str, Series] = field(default_factory=dict)  # contract.HOST_METRICS name -> series
    log_last_t: float | None = None  # newest event on any of the host's streams
    log_tail: tuple[LogLine, ...] = ()  # the newest lines, oldest first
    error_lines: tuple[LogLine, ...] = ()  # lines that matched a fatal-error pattern
    marker_lines: tuple[LogLine, ...] = ()  # checkpoint start and end lines (`log_patterns.marker`)
    # The sweeper's LogIdleSeconds (contract.LOG_IDLE_SECONDS): a sawtooth whose resets mark the log gaps it saw.
    log_idle: Series = Series()

    def agent_series(self, name: str) -> Series:
        """The agent's per-host series `name`, or, where the host has none, its old name's (an agent of the release
        before the rename: contract.RENAMED_METRICS)."""
        series = self.agent.get(name, Series())
        old = OLD_NAMES.get(name)
        return self.agent.get(old, series) if old is not None and not len(series) else series


@dataclass(frozen=True)
class JobSignals:
    """Everything known about one job at `now`."""

    facts: JobFacts
    now: float
    hosts: dict[str, HostSignals] = field(default_factory=dict)
    agent: dict[str, Series] = field(default_factory=dict)  # contract.JOB_METRICS name -> series (rank 0)
    # The agent's stack dumps (`core.stack_dumps`) read since the job's last step: every rank's at a stall.
    stacks: tuple[LogLine, ...] = ()

    @property
    def has_agent(self) -> bool:
        return any(len(s) for s in self.agent.values())


class SignalSource(Protocol):
    """Where signals come from: AWS in the Lambdas, a trace file in replay."""

    def job_signals(self, job_name: str, now: float) -> JobSignals:
        """A snapshot of the job as of `now` (epoch seconds), looking back far enough to decide."""
        ...
