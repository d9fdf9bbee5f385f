"""The platform seam: what Stallwatch needs of a platform, as one interface and one pure description.

    describe(facts.platform).host_names(facts)           # core.platforms: names, hosts, metrics, log streams
    adapter(facts.platform, clients).stop(facts)         # aws.platforms: the platform's API behind `PlatformAdapter`

A platform is two modules, each with its registry entry: its description (`core.platforms.<name>`, a
`PlatformDescription`: pure data and rules) and its adapter (`aws.platforms.<name>`, a `PlatformAdapter`: facts,
signals, stop). Nothing else names a platform: callers ask the registries (tests/test_platform_seam.py checks it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from stallwatch.core.signals import JobFacts, JobSignals, Platform, Series

# How a description reads one of a host's platform series in replay: (namespace, name, dimensions, divisor) -> series.
SeriesReader = Callable[[str, str, dict[str, str], float], Series]


@dataclass(frozen=True)
class MetricMath:
    """A host's per-device GPU percentage as CloudWatch metric math: the series it reads (id -> namespace, metric
    name, dimensions; their Average) and the expression over them."""

    inputs: dict[str, tuple[str, str, dict[str, str]]]
    expression: str
    label: str


class PlatformDescription:
    """One platform as data and pure rules: how it names jobs and hosts, where its host metrics and logs are."""

    platform: ClassVar[Platform]
    label: ClassVar[str]  # "SageMaker": in messages and exported traces
    job_kind: ClassVar[str]  # "a SageMaker job"
    job_name: ClassVar[re.Pattern[str]]  # every name a job of it can have
    # Names that are this platform's before any other's (an instance id is EC2's); None: no such names.
    name_hint: ClassVar[re.Pattern[str] | None] = None
    monitor_setting: ClassVar[str]  # the `Policy` field that turns watching it on
    host_agent_metrics: ClassVar[tuple[str, ...]]  # the agent's per-host series a decision reads (core.reading)
    named_hosts: ClassVar[bool] = False  # its hosts are named by the platform (`JobFacts.instance_ids`), not counted

    def names_job(self, name: str) -> bool:
        return self.job_name.match(name) is not None

    def hosts(self, instance_count: int, instance_ids: Sequence[str]) -> list[str]:
        """The job's hosts as the signals name them."""
        raise NotImplementedError

    def host_names(self, facts: JobFacts) -> list[str]:
        return self.hosts(facts.instance_count, facts.instance_ids)

    def gpu_utilization(self, facts: JobFacts, host: str) -> MetricMath:
        """The host's GPU utilization per device, for its gpu-idle alarm."""
        raise NotImplementedError

    def gpu_memory(self, facts: JobFacts, host: str) -> MetricMath:
        """The host's GPU memory per device, for its gpu-memory alarm."""
        raise NotImplementedError

    def host_of_stream(self, stream: str, job: str, hosts: Collection[str]) -> str | None:
        """The host among `hosts` whose log stream `stream` is; None for another job's or no host's."""
        raise NotImplementedError

    def host_series(self, facts: JobFacts, host: str, read: SeriesReader) -> dict[str, Series]:
        """The host's `HostSignals` platform fields, per device, from its raw series as `read` gives them."""
        raise NotImplementedError


@dataclass(frozen=True)
class StopResult:
    """Whether the job is stopped or stopping now, and what the platform said; where a job is several instances,
    how many of them are (`stopped` of `targets`)."""

    ok: bool
    detail: str
    stopped: int | None = None
    targets: int | None = None

    @property
    def count(self) -> str:
        """ "3 of 4 instances stopping", or "" where the platform stops one job."""
        return "" if self.targets is None else f"{self.stopped} of {self.targets} instances stopping"


class PlatformAdapter(Protocol):
    """One platform's API, as the runtime, the sweeper and the CLI use it (`aws.platforms.adapter`).

    Reads raise `aws.source.JobNotFoundError` for a job the platform does not know; `stop` never raises for an API
    error (it returns it)."""

    platform: ClassVar[Platform]
    description: ClassVar[PlatformDescription]

    def facts(self, job_name: str) -> JobFacts:
        """What the platform says about the job now."""
        ...

    def job_signals(
        self, job_name: str, now: float, freshness: dict[str, float] | None = None, facts: JobFacts | None = None
    ) -> JobSignals:
        """The job's signals at `now`: `freshness`, each host's newest log event if the caller knows it; `facts`,
        the job's if the caller has just read them."""
        ...

    def many_job_signals(
        self,
        job_names: Iterable[str],
        now: float,
        freshness: dict[str, dict[str, float]] | None = None,
        known: dict[str, JobFacts] | None = None,
    ) -> dict[str, JobSignals]:
        """Several jobs' signals, their metrics read together."""
        ...

    def stop(self, facts: JobFacts) -> StopResult:
        """Stop the job as `facts` describe it (its hosts in `facts.instance_ids`, where the platform stops hosts)."""
        ...
