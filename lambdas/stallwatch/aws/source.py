"""Signals from AWS: the CloudWatch metric (GetMetricData) and CloudWatch Logs reads every platform's adapter
shares; each platform (`aws.platforms`) adds its facts, its own host series and its logs.

    source = adapter(Platform.SAGEMAKER, clients)          # aws.platforms: an `AwsSignalSource` of one platform
    signals = source.job_signals("my-job", now=time.time())
    batch = source.many_job_signals(["a", "b"], now)        # read together, 500 queries per GetMetricData call

A job's agent series are read by name, and each host metric of the agent as one SEARCH over all of its hosts
(`metric_reads`), so the reads do not grow with its hosts; a platform adds its own host metrics (`_platform_reads`),
turns them into the `HostSignals` fields (`_platform_series`) and reads its hosts' logs (`_host_logs`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, get_args

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.log_reads import HostLog
from stallwatch.aws.metric_reads import MAX_SERIES_PER_SEARCH, MetricQuery, MetricRef, SearchRef, read_metrics
from stallwatch.aws.ssm import Documents
from stallwatch.aws.store import Store
from stallwatch.core import alarms, contract, stack_dumps
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.doctor_checks import Check, Probe, StackFound, rule_check
from stallwatch.core.platforms.interface import (
    JobChange,
    PlatformDescription,
    StopOutcome,
    StopResult,
    Teller,
    WayBackAttempt,
    WayBackResult,
)
from stallwatch.core.reading import (
    AGENT_STATISTICS,
    ERROR_LINES_PER_HOST,
    LOG_LINES_PER_HOST,
    LOOKBACK_SECONDS,
    host_period,
)
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Platform, Series

AGENT_DIMENSIONS = (contract.DIM_JOB, contract.DIM_HOST)
AGENT_LABEL = "${PROP('Dim.JobName')} ${PROP('Dim.Host')}"  # job names have no spaces
PART_LABEL = "${PROP('MetricName')}"  # a part of a job's hosts reads several metrics: its labels name each one's
MAX_EXCLUDED_PER_SEARCH = 24  # hosts a SEARCH names to leave out (its expression stays short); more: one more call


class JobNotFoundError(LookupError):
    """The platform does not know the job (or instance)."""


@dataclass(frozen=True)
class JobReads:
    """What one job's signals read: the job's series by name, and each host metric as one SEARCH over all of the
    job's hosts (a platform's own metrics as SEARCHes too, or per host by name)."""

    job: dict[str, MetricRef] = field(default_factory=dict)  # JOB_METRICS name -> ref
    agent: dict[str, SearchRef] = field(default_factory=dict)  # HOST_METRICS name -> search, labelled "job host"
    platform: dict[str, SearchRef] = field(default_factory=dict)  # HostSignals field -> search over the hosts
    instances: dict[tuple[str, str], MetricRef] = field(default_factory=dict)  # (host, field) -> ref
    log_idle: SearchRef | None = None  # the sweeper's LogIdleSeconds, labelled "job host"
    named: dict[MetricRef, tuple[SearchRef, str]] = field(default_factory=dict)  # hosts a SEARCH leaves out
    # The SEARCHes sent in place of the searches above, where a platform reads its hosts by name (`host_parts`):
    # each one's series, labelled "<metric> job host", are the searches' of that metric name.
    parts: dict[SearchRef, dict[str, SearchRef]] = field(default_factory=dict)

    def all(self) -> Iterator[MetricQuery]:
        yield from self.job.values()
        yield from self.named
        covered = {search for by_name in self.parts.values() for search in by_name.values()}
        yield from (search for search in self.searches() if search not in covered)
        yield from self.parts
        yield from self.instances.values()

    def searches(self) -> list[SearchRef]:
        return [*self.agent.values(), *self.platform.values(), *filter(None, [self.log_idle])]


class AwsSignalSource(ABC):
    """`SignalSource` over one platform, CloudWatch metrics and CloudWatch Logs: the shared half of every
    `aws.platforms` adapter."""

    platform: ClassVar[Platform]
    description: ClassVar[PlatformDescription]
    # its EventBridge state-change event, or a union of them (`aws/platforms/<name>_events.py`)
    state_event: ClassVar[Any]
    state_rule: ClassVar[str]  # the doctor's name of the stack's rule of those events: "EC2 instance states rule"

    def __init__(
        self,
        clients: AwsClients,
        config: StallwatchConfig | None = None,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        documents: Documents | None = None,
    ) -> None:
        self.clients = clients
        self.config = config or StallwatchConfig()
        self.policy = self.config.policy  # each job is read at its alarms' period, after its tags (10 s in the demo)
        self.store = store  # the deployment's table, where a platform's facts are what its events said (Slurm)
        self.clock = clock  # what facts that age read the time from (a Slurm job's held state)
        self.documents = documents or Documents()  # the deployment's SSM documents its actions send

    @abstractmethod
    def facts(self, job_name: str) -> JobFacts:
        """What the platform says about the job; `JobNotFoundError` if it does not exist."""

    @abstractmethod
    def stop(self, facts: JobFacts) -> StopResult:
        """Stop the job; API errors are returned, never raised (`aws.actions.stop`)."""

    def way_back(self, attempt: WayBackAttempt, teller: Teller) -> WayBackResult:
        """No way back in place of the stop: the job is stopped (a platform whose way back replaces its stop, or is
        it, overrides this)."""
        reason = f"{self.description.label} jobs have no way back in place of their stop"
        return WayBackResult(audited={"status": "not_recovered", "reason": reason}, reason=reason)

    def continue_way_back(self, now: float, teller: Teller) -> list[dict[str, Any]]:
        """No way back of several steps: nothing to continue."""
        return []

    def way_back_under_way(self, job: str) -> bool:
        return False

    def stop_outcome(self, facts: JobFacts, result: StopResult, sent_at: float, now: float) -> StopOutcome | None:
        """How an asynchronous stop went: none is, where the platform's stop answers at once."""
        raise NotImplementedError(f"{self.platform} stops answer at once")

    def iam_probes(self, region: str, account: str) -> list[Probe]:
        """The doctor's IAM questions of the platform: none where it grants nothing under a tag."""
        return []

    def doctor(self, found: StackFound) -> Iterator[Check]:
        """The doctor's checks of the platform: the stack's rule of its state-change events (its source, the event
        model's), and a platform's own resources where it adds them."""
        [source] = get_args(self.state_event.model_fields["source"].annotation)
        yield rule_check(found, self.state_rule, source)

    def reconcile(self, now: float) -> list[JobChange]:
        """What the platform's own view says happened to its running jobs that no event told (none, where every
        change has its event)."""
        return []

    @abstractmethod
    def _platform_reads(self, facts: JobFacts, reads: JobReads, hosts_period: int | None) -> JobReads:
        """`reads` with the platform's own host series (`hosts_period`: the hosts' period, if coarser)."""

    @abstractmethod
    def _platform_series(
        self,
        facts: JobFacts,
        host: str,
        reads: JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        per_host: dict[MetricQuery, dict[str, Series]],
    ) -> dict[str, Series]:
        """The host's `HostSignals` platform fields (per device), from what was read."""

    @abstractmethod
    def _host_logs(
        self,
        facts: JobFacts,
        hosts: list[str],
        per_host: dict[MetricQuery, dict[str, Series]],
        reads: JobReads,
        freshness: dict[str, float],
        now: float,
        stacks_since: float | None = None,
    ) -> dict[str, HostLog]:
        """The hosts' log tails, newest event times and notable lines (and, with `stacks_since`, the agent's stack
        dumps since then)."""

    def job_of_log_stream(self, group: str, stream: str) -> str | None:
        """The watched job whose host writes `stream` in `group` (a subscription's delivery); None for a group not
        the platform's (`PlatformDescription.log_group`), a stream no job of it writes, or a platform not watched."""
        if not self.config.watches(self.platform) or group != self.config.log_group(self.platform):
            return None
        return self._job_of_stream(stream)

    def _job_of_stream(self, stream: str) -> str | None:
        """The watched job whose host writes `stream` in the platform's log group, else None (a platform with a
        log group of its own implements it)."""
        raise NotImplementedError

    def job_signals(
        self, job_name: str, now: float, freshness: dict[str, float] | None = None, facts: JobFacts | None = None
    ) -> JobSignals:
        """`freshness`: each host's newest log event, if the caller knows it (the sweeper's query); `facts`: the
        job's, if the caller has just read them."""
        known = {job_name: facts} if facts is not None else None
        return self.many_job_signals([job_name], now, {job_name: freshness or {}}, known)[job_name]

    def many_job_signals(
        self,
        job_names: Iterable[str],
        now: float,
        freshness: dict[str, dict[str, float]] | None = None,
        known: dict[str, JobFacts] | None = None,
    ) -> dict[str, JobSignals]:
        """Signals of several jobs; their metrics are read together (one SEARCH per host metric and job, whatever
        its hosts), 500 queries per GetMetricData call. `known`: facts the caller read already."""
        facts = {name: (known or {}).get(name) or self.facts(name) for name in job_names}
        reads = {name: self._reads(f) for name, f in facts.items()}
        periods = {name: self.policy.for_job(f.tags).thresholds.alarm_period_seconds for name, f in facts.items()}
        found = self._read({name: r.all() for name, r in reads.items()}, periods, now)
        extra = {name: self._beyond_search(facts[name], reads[name], found) for name in facts}
        if any(extra.values()):  # jobs of more hosts than one SEARCH returns: the rest by name, one more call
            found |= self._read({name: list(refs) for name, refs in extra.items()}, periods, now)
        return {
            name: self._assemble(facts[name], reads[name], found, extra[name], (freshness or {}).get(name, {}), now)
            for name in facts
        }

    def _read(
        self, wanted: dict[str, Iterable[MetricQuery]], periods: dict[str, int], now: float
    ) -> dict[MetricQuery, dict[str, Series]]:
        by_period: dict[int, list[MetricQuery]] = defaultdict(list)
        for name, queries in wanted.items():
            by_period[periods[name]].extend(queries)
        found: dict[MetricQuery, dict[str, Series]] = {}
        for period, queries in by_period.items():
            if queries:
                found |= read_metrics(self.clients.cloudwatch, queries, now - LOOKBACK_SECONDS, now, period)
        return found

    def _reads(self, facts: JobFacts) -> JobReads:
        job_dim = ((contract.DIM_JOB, facts.name),)
        period = self.policy.for_job(facts.tags).thresholds.alarm_period_seconds
        coarser = host_period(len(alarms.host_names(facts)), period, self.description.host_series_read)
        hosts_period = coarser if coarser != period else None  # a job of many hosts: one answer still holds them
        reads = JobReads(
            job={
                name: MetricRef(contract.NAMESPACE, name, job_dim, AGENT_STATISTICS.get(name, "Average"))
                for name in contract.JOB_METRICS
            },
            agent={
                name: agent_search(name, job_dim, AGENT_STATISTICS.get(name, "Average"), hosts_period)
                for name in self.description.agent_metrics(facts)
            },
        )
        return self._platform_reads(facts, reads, hosts_period)

    def _beyond_search(
        self, facts: JobFacts, reads: JobReads, found: dict[MetricQuery, dict[str, Series]]
    ) -> dict[MetricRef, tuple[SearchRef, str]]:
        """Named series for the hosts a SEARCH could not return (a job of more than 500 hosts)."""
        hosts = alarms.host_names(facts)
        if len(hosts) <= MAX_SERIES_PER_SEARCH:
            return {}
        extra: dict[MetricRef, tuple[SearchRef, str]] = {}
        named = set(reads.named.values())
        for search in reads.searches():
            if len(found.get(search, {})) < MAX_SERIES_PER_SEARCH:
                continue  # not cut short: a host missing from it has no such series
            seen = _by_host(found.get(search, {}), facts.name)
            for host in hosts:
                if host not in seen and (search, host) not in named:
                    extra[search.named(self._host_dimensions(search, facts.name, host))] = (search, host)
        return extra

    def _assemble(
        self,
        facts: JobFacts,
        reads: JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        extra: dict[MetricRef, tuple[SearchRef, str]],
        freshness: dict[str, float],
        now: float,
    ) -> JobSignals:
        found = _from_parts(found, reads.parts)
        per_host = {search: _by_host(found.get(search, {}), facts.name) for search in reads.searches()}
        for ref, (search, host) in {**reads.named, **extra}.items():
            per_host[search][host] = found[ref][""]
        hosts: dict[str, HostSignals] = {}
        names = alarms.host_names(facts)
        agent = {name: found[ref][""] for name, ref in reads.job.items()}
        stacks_since = stack_dumps.dumps_since(agent, now - LOOKBACK_SECONDS)  # None: stepping, or no agent
        logs = self._host_logs(facts, names, per_host, reads, freshness, now, stacks_since)
        for host in names:
            log = logs.get(host, HostLog())
            platform = self._platform_series(facts, host, reads, found, per_host)
            notable = sorted({*log.notable, *(ln for ln in log.lines if ln.pattern or ln.marker)}, key=_line_order)
            hosts[host] = HostSignals(
                host=host,
                gpu_util=platform["gpu_util"],
                gpu_mem_util=platform["gpu_mem_util"],
                cpu_util=platform["cpu_util"],
                gpu_power=platform.get("gpu_power", Series()),
                agent={name: per_host[search].get(host, Series()) for name, search in reads.agent.items()},
                log_last_t=log.last_t,
                log_tail=tuple(log.lines[-LOG_LINES_PER_HOST:]),
                error_lines=tuple([line for line in notable if line.pattern][-ERROR_LINES_PER_HOST:]),
                marker_lines=tuple([line for line in notable if line.marker][-ERROR_LINES_PER_HOST:]),
                log_idle=per_host[reads.log_idle].get(host, Series()) if reads.log_idle else Series(),
            )
        dumps = sorted({line for log in logs.values() for line in log.stacks}, key=_line_order)
        return JobSignals(facts=facts, now=now, hosts=hosts, agent=agent, stacks=tuple(dumps))

    def _known_freshness(
        self,
        facts: JobFacts,
        per_host: dict[MetricQuery, dict[str, Series]],
        reads: JobReads,
        freshness: dict[str, float],
        now: float,
    ) -> dict[str, float]:
        """Each host's newest log event as the sweeper last published it (its `LogIdleSeconds`), or as the caller
        knows it, whichever is later."""
        known: dict[str, float] = {}
        if reads.log_idle is not None:
            period = reads.log_idle.period or self.policy.for_job(facts.tags).thresholds.alarm_period_seconds
            known = {
                host: min(t + period - idle, now)  # the datapoint's period holds the publication: its end bounds it
                for host, series in per_host[reads.log_idle].items()
                if series.points
                for t, idle in [series.points[-1]]
            }
        for host, t in freshness.items():
            known[host] = max(known.get(host, t), t)
        return known

    def _host_dimensions(self, search: SearchRef, job: str, host: str) -> tuple[tuple[str, str], ...]:
        """The dimensions of one host's series of `search` (to read it by name)."""
        if search.namespace == contract.NAMESPACE:
            return ((contract.DIM_JOB, job), (contract.DIM_HOST, host))
        return self._platform_host_dimensions(job, host)

    def _platform_host_dimensions(self, job: str, host: str) -> tuple[tuple[str, str], ...]:
        """The dimensions of one host's series of the platform's own SEARCHes (where it reads any)."""
        raise NotImplementedError(f"{self.platform} reads no host series by SEARCH")

    def _beyond_one_search(self, reads: JobReads, facts: JobFacts) -> JobReads:
        """A job of more hosts than one SEARCH returns: the first `MAX_SERIES_PER_SEARCH` hosts by SEARCH, the next
        ones (up to `MAX_EXCLUDED_PER_SEARCH`, and as many as keep the SEARCH within CloudWatch's 1,024 characters:
        fewer for a long job name, whose hosts SageMaker names ``<job>/algo-N``) left out of it by name and read by
        name in the same call; any others are read by name after it (`_beyond_search`)."""
        beyond = alarms.host_names(facts)[MAX_SERIES_PER_SEARCH:][:MAX_EXCLUDED_PER_SEARCH]
        if not beyond:
            return reads
        named: dict[MetricRef, tuple[SearchRef, str]] = {}

        def split(search: SearchRef) -> SearchRef:
            def host_dimension(host: str) -> tuple[str, str]:
                return ("Host", dict(self._host_dimensions(search, facts.name, host))["Host"])

            excluded = search
            for count in range(1, len(beyond) + 1):
                wider = replace(search, excluded=tuple(host_dimension(host) for host in beyond[:count]))
                if not wider.fits():
                    break
                excluded = wider
            for host in beyond[: len(excluded.excluded)]:
                named[excluded.named(self._host_dimensions(search, facts.name, host))] = (excluded, host)
            return excluded

        agent = {name: split(search) for name, search in reads.agent.items()}
        platform = {fld: split(search) for fld, search in reads.platform.items()}
        idle = split(reads.log_idle) if reads.log_idle else None
        return replace(reads, agent=agent, platform=platform, log_idle=idle, named=named)


def agent_search(
    name: str, job_dim: tuple[tuple[str, str], ...], statistic: str, period: int | None = None
) -> SearchRef:
    """One metric of every host of the job, in the Stallwatch namespace (the agent's, and `LogIdleSeconds`)."""
    return SearchRef(contract.NAMESPACE, name, AGENT_DIMENSIONS, job_dim, statistic, AGENT_LABEL, period=period)


def host_parts(searches: Iterable[SearchRef], hosts: Sequence[str]) -> dict[SearchRef, dict[str, SearchRef]]:
    """`searches` sent as SEARCHes over parts of `hosts` (exact phrases, `SearchRef.any_of`), the searches of one
    schema, job, statistic and period together (their metric names ORed), each part as many hosts as keep it within
    CloudWatch's 1,024 characters and 500 series: 34 to 37 instance ids a part, so that an EC2 job of 1,000 instances
    is 89 to 94 SEARCHes, one GetMetricData call. Each part maps the metric names it reads to their searches."""
    together: dict[tuple[object, ...], list[SearchRef]] = defaultdict(list)
    for s in searches:
        together[s.namespace, s.dimension_names, s.exact, s.statistic, s.period, s.label, s.divisor].append(s)
    parts: dict[SearchRef, dict[str, SearchRef]] = {}
    for group in together.values():
        by_name = {s.name: s for s in group}
        base = replace(group[0], names=tuple(s.name for s in group[1:]), label=f"{PART_LABEL} {group[0].label}")
        most = MAX_SERIES_PER_SEARCH // len(by_name)
        part: tuple[str, ...] = ()
        for host in hosts:
            wider = replace(base, any_of=(*part, host))
            if part and (len(part) == most or not wider.fits()):
                parts[replace(base, any_of=part)] = by_name
                wider = replace(base, any_of=(host,))
            if not wider.fits():
                raise ValueError(f"host {host!r}: a SEARCH of {sorted(by_name)} over it is over 1,024 characters")
            part = wider.any_of
        if part:
            parts[replace(base, any_of=part)] = by_name
    return parts


def _from_parts(
    found: dict[MetricQuery, dict[str, Series]], parts: dict[SearchRef, dict[str, SearchRef]]
) -> dict[MetricQuery, dict[str, Series]]:
    """`found` with each part's series under its searches, by the metric name its label starts with."""
    merged = dict(found)
    for part, by_name in parts.items():
        for search in by_name.values():
            merged.setdefault(search, {})
        for label, series in found.get(part, {}).items():
            name, _, rest = label.partition(" ")
            if name in by_name:
                merged[by_name[name]][rest] = series
    return merged


def _by_host(found: dict[str, Series], job: str) -> dict[str, Series]:
    """A SEARCH's series by host, from their labels (``job host``, or SageMaker's ``job/host``); other jobs' series
    (a SEARCH matches phrases, not whole names) are dropped."""
    out: dict[str, Series] = {}
    for label, series in found.items():
        owner, _, host = label.partition(" ") if " " in label else label.partition("/")
        if owner == job and host:
            out[host] = series
    return out


def _line_order(line: LogLine) -> tuple[float, str, str]:
    return line.t, line.stream, line.message
