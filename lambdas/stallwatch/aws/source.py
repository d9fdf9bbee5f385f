"""Signals from AWS: SageMaker/EC2 facts, CloudWatch metrics (GetMetricData) and CloudWatch Logs.

    clients = AwsClients()                                  # lazy boto3 clients, adaptive retries
    source = AwsSignalSource(clients, Platform.SAGEMAKER)
    signals = source.job_signals("my-job", now=time.time())
    batch = source.many_job_signals(["a", "b"], now)        # read together, 500 queries per GetMetricData call

A SageMaker job's reads do not grow with its hosts: each host metric is one SEARCH over all of them
(`metric_reads`), each host's log freshness is the sweeper's `LogIdleSeconds`, and its log tail is at most two pages
(`log_reads`). An EC2 job's platform metrics are read per instance by name, its logs from its hosts' instance-id
streams in the job's log group.

Platform metrics are normalized per device: SageMaker publishes GPU/CPU utilization summed over a host's
devices (divided after the read by each host's own type's devices, as a heterogeneous job's hosts differ); EC2 hosts
use the CloudWatch agent's nvidia_smi_* metrics aggregated by InstanceId (see docs/lambdas.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.log_reads import HostLog, read_tails
from stallwatch.aws.metric_reads import MAX_SERIES_PER_SEARCH, MetricQuery, MetricRef, SearchRef, read_metrics
from stallwatch.aws.stack_reads import read_stacks
from stallwatch.core import alarms, clusters, contract, log_patterns, stacks
from stallwatch.core.config import EC2_LOG_GROUP
from stallwatch.core.policy import EC2_MONITOR_TAG, Policy
from stallwatch.core.pricing import instance_spec
from stallwatch.core.reading import (
    AGENT_STATISTICS,
    EC2_HOST_AGENT_METRICS_READ,
    EC2_STREAM,
    ERROR_LINES_PER_HOST,
    FILTER_STREAMS_LIMIT,
    HOST_AGENT_METRICS_READ,
    LOG_LINES_PER_HOST,
    LOG_TAIL_SECONDS,
    LOOKBACK_SECONDS,
    SAGEMAKER_HOST_METRICS_READ,
    SAGEMAKER_STREAM,
    host_period,
)
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Platform, Series

LOG_TAIL_PAGES = 2  # EC2: FilterLogEvents pages of a job's streams
RECENT_STREAM_PAGES = 2  # EC2: pages of a log group's most recently written streams read before asking per host
AGENT_DIMENSIONS = (contract.DIM_JOB, contract.DIM_HOST)
AGENT_LABEL = "${PROP('Dim.JobName')} ${PROP('Dim.Host')}"  # job names have no spaces
SAGEMAKER_HOST_LABEL = "${PROP('Dim.Host')}"  # "<job>/algo-N"
MAX_EXCLUDED_PER_SEARCH = 24  # hosts a SEARCH names to leave out (its expression stays short); more: one more call

# Platform metrics per host, keyed by what `_assemble` reads: SageMaker name, or EC2 (namespace, name).
SAGEMAKER_HOST_METRICS = {
    "gpu_util": "GPUUtilization",
    "gpu_mem_util": "GPUMemoryUtilization",
    "cpu_util": "CPUUtilization",
}
EC2_HOST_METRICS = {
    "gpu_util": (contract.CWAGENT_NAMESPACE, alarms.CWAGENT_GPU_UTILIZATION),
    "gpu_mem_used": (contract.CWAGENT_NAMESPACE, alarms.CWAGENT_GPU_MEMORY_USED),
    "gpu_mem_total": (contract.CWAGENT_NAMESPACE, alarms.CWAGENT_GPU_MEMORY_TOTAL),
    "cpu_util": (contract.EC2_NAMESPACE, "CPUUtilization"),
    "gpu_power": (contract.CWAGENT_NAMESPACE, alarms.CWAGENT_GPU_POWER),
}
# The instances a sweep looks at: running, and tagged with a job or the monitor tag (EC2 filters match tag values
# exactly, so the values are matched in code, as `clusters.job_of` does).
EC2_WATCHED_FILTERS = [
    {"Name": "tag-key", "Values": [clusters.JOB_TAG, EC2_MONITOR_TAG]},
    {"Name": "instance-state-name", "Values": ["running"]},
]


class JobNotFoundError(LookupError):
    """The platform does not know the job (or instance)."""


@dataclass(frozen=True)
class _JobReads:
    """What one job's signals read: the job's series by name, and each host metric as one SEARCH over all of the
    job's hosts (EC2 platform metrics, per instance, by name)."""

    job: dict[str, MetricRef] = field(default_factory=dict)  # JOB_METRICS name -> ref
    agent: dict[str, SearchRef] = field(default_factory=dict)  # HOST_METRICS name -> search, labelled "job host"
    platform: dict[str, SearchRef] = field(default_factory=dict)  # SageMaker: HostSignals field -> search
    instances: dict[tuple[str, str], MetricRef] = field(default_factory=dict)  # EC2: (host, field) -> ref
    log_idle: SearchRef | None = None  # SageMaker: the sweeper's LogIdleSeconds, labelled "job host"
    named: dict[MetricRef, tuple[SearchRef, str]] = field(default_factory=dict)  # hosts a SEARCH leaves out

    def all(self) -> Iterator[MetricQuery]:
        yield from self.job.values()
        yield from self.named
        yield from self.agent.values()
        yield from self.platform.values()
        yield from self.instances.values()
        if self.log_idle:
            yield self.log_idle


class AwsSignalSource:
    """`SignalSource` over SageMaker or EC2, CloudWatch metrics and CloudWatch Logs."""

    def __init__(
        self,
        clients: AwsClients,
        platform: Platform = Platform.SAGEMAKER,
        policy: Policy | None = None,
        ec2_log_group: str = EC2_LOG_GROUP,
    ) -> None:
        self.clients = clients
        self.platform = platform
        self.policy = policy or Policy()  # each job is read at its alarms' period, after its tags (10 s in the demo)
        self.ec2_log_group = ec2_log_group

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

    def facts(self, job_name: str) -> JobFacts:
        """What the platform says about the job; `JobNotFoundError` if it does not exist."""
        if self.platform is Platform.SAGEMAKER:
            return self._sagemaker_facts(job_name)
        return self._ec2_facts(job_name)

    def _sagemaker_facts(self, job_name: str) -> JobFacts:
        sagemaker = self.clients.sagemaker
        try:
            job = sagemaker.describe_training_job(TrainingJobName=job_name)
        except sagemaker.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                raise JobNotFoundError(f"training job {job_name!r}: {exc.response['Error']['Message']}") from exc
            raise
        tags = sagemaker.list_tags(ResourceArn=job["TrainingJobArn"]).get("Tags", [])
        layout = clusters.sagemaker_layout(job["ResourceConfig"])
        spec = instance_spec(layout.instance_type)
        history = tuple((t["StartTime"].timestamp(), t["Status"]) for t in job.get("SecondaryStatusTransitions", []))
        start = job.get("TrainingStartTime") or job["CreationTime"]
        return JobFacts(
            name=job_name,
            platform=Platform.SAGEMAKER,
            status=job["TrainingJobStatus"],
            secondary_status=job.get("SecondaryStatus"),
            start_time=start.timestamp(),
            instance_type=layout.instance_type,
            instance_count=layout.instance_count,
            gpus_per_host=spec.devices,
            vcpus_per_host=spec.vcpus,
            tags={t["Key"]: t["Value"] for t in tags},
            status_history=history,
            host_types=layout.host_types,
        )

    def _ec2_facts(self, job_name: str) -> JobFacts:
        return self._ec2_group_facts(job_name, self.ec2_group(job_name))

    def job_of_log_stream(self, group: str, stream: str) -> str | None:
        """The job of this platform whose host writes `stream` in `group` (a subscription's log event), else None (and
        where the policy does not monitor the platform). SageMaker: ``<job>/algo-N-<epoch>`` in its group; EC2: an
        instance id in the configured group (one DescribeInstances), and the job its tags name, if it is watched."""
        if self.platform is Platform.SAGEMAKER:
            match = SAGEMAKER_STREAM.match(stream)
            if not self.policy.monitor_sagemaker or group != contract.SAGEMAKER_LOG_GROUP or match is None:
                return None
            return match["job"] if clusters.job_name_error(match["job"], Platform.SAGEMAKER) is None else None
        match = EC2_STREAM.match(stream)
        if not self.policy.monitor_ec2 or group != self.ec2_log_group or match is None:
            return None
        try:
            instance = self.ec2_instance(match["host"])
        except JobNotFoundError:
            return None
        return clusters.job_of(_tags(instance), instance["InstanceId"])

    def ec2_group(self, job_name: str) -> list[dict[str, Any]]:
        """An EC2 job's instances (DescribeInstances): those tagged `stallwatch:job=<job_name>`, or the untagged
        instance `job_name`; `JobNotFoundError` if there are none."""
        if not clusters.INSTANCE_ID.match(job_name):
            instances = self._describe_instances(Filters=[{"Name": f"tag:{clusters.JOB_TAG}", "Values": [job_name]}])
            if not instances:
                raise JobNotFoundError(f"no EC2 instance is tagged {clusters.JOB_TAG}={job_name!r}")
            return instances
        instance = self.ec2_instance(job_name)
        owner = clusters.job_of(_tags(instance), job_name)
        if owner not in (None, job_name):
            raise JobNotFoundError(f"EC2 instance {job_name!r} belongs to job {owner!r}")
        return [instance]

    def ec2_instance(self, instance_id: str) -> dict[str, Any]:
        """DescribeInstances of one instance; `JobNotFoundError` if EC2 does not know it."""
        ec2 = self.clients.ec2
        try:
            instances = self._describe_instances(InstanceIds=[instance_id])
        except ec2.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"].startswith("InvalidInstanceID"):
                raise JobNotFoundError(f"EC2 instance {instance_id!r}: {exc.response['Error']['Message']}") from exc
            raise
        if not instances:
            raise JobNotFoundError(f"EC2 instance {instance_id!r} not found")
        return instances[0]

    def ec2_jobs(self) -> dict[str, JobFacts]:
        """Every watched EC2 job with a running instance, from one paginated DescribeInstances."""
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for instance in self._describe_instances(Filters=EC2_WATCHED_FILTERS):
            name = clusters.job_of(_tags(instance), instance["InstanceId"])
            if name is not None:
                groups[name].append(instance)
        return {name: self._ec2_group_facts(name, instances) for name, instances in sorted(groups.items())}

    def _describe_instances(self, **request: Any) -> list[dict[str, Any]]:
        pages = self.clients.ec2.get_paginator("describe_instances").paginate(**request)
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _ec2_group_facts(self, name: str, instances: list[dict[str, Any]]) -> JobFacts:
        """The job's facts from its instances: hosts, types, status, and one tag set (disagreements reported)."""
        states = {i["InstanceId"]: i["State"]["Name"] for i in instances}
        hosts = clusters.ec2_hosts(states)
        members = [i for i in instances if i["InstanceId"] in hosts]
        layout = clusters.ec2_layout({i["InstanceId"]: i["InstanceType"] for i in members})
        merged = clusters.merge_instance_tags([_tags(i) for i in members], self.policy)
        log_group, log_group_error = clusters.log_group_of(merged.tags, self.ec2_log_group)
        errors = [*merged.errors, *filter(None, [clusters.job_tag_error(merged.tags), log_group_error])]
        spec = instance_spec(layout.instance_type)
        return JobFacts(
            name=name,
            platform=Platform.EC2,
            status=clusters.ec2_status(states.values()),
            secondary_status=None,
            start_time=min(i["LaunchTime"].timestamp() for i in members),
            instance_type=layout.instance_type,
            instance_count=layout.instance_count,
            gpus_per_host=spec.devices,
            vcpus_per_host=spec.vcpus,
            tags=merged.tags,
            instance_ids=tuple(hosts),
            host_types=layout.host_types,
            tag_errors=tuple(errors),
            log_group=log_group,
        )

    def _reads(self, facts: JobFacts) -> _JobReads:
        job_dim = ((contract.DIM_JOB, facts.name),)
        period = self.policy.for_job(facts.tags).thresholds.alarm_period_seconds
        coarser = host_period(len(alarms.host_names(facts)), period)
        hosts_period = coarser if coarser != period else None  # a job of many hosts: one answer still holds them
        reads = _JobReads(
            job={
                name: MetricRef(contract.NAMESPACE, name, job_dim, AGENT_STATISTICS.get(name, "Average"))
                for name in contract.JOB_METRICS
            },
            agent={
                name: _agent_search(name, job_dim, AGENT_STATISTICS.get(name, "Average"), hosts_period)
                for name in (EC2_HOST_AGENT_METRICS_READ if facts.platform is Platform.EC2 else HOST_AGENT_METRICS_READ)
            },
        )
        if facts.platform is Platform.EC2:
            for host in alarms.host_names(facts):
                dims = ((alarms.CWAGENT_DIM_INSTANCE, host),)
                reads.instances.update(
                    {(host, fld): MetricRef(ns, name, dims) for fld, (ns, name) in EC2_HOST_METRICS.items()}
                )
            return reads
        # Undivided: `_assemble` divides each host by its own devices (a heterogeneous job's hosts differ).
        reads.platform.update(
            {
                fld: SearchRef(
                    contract.SAGEMAKER_NAMESPACE,
                    name,
                    ("Host",),
                    (),
                    "Average",
                    SAGEMAKER_HOST_LABEL,
                    phrase=f"{facts.name}/",
                    period=hosts_period,
                )
                for fld, name in SAGEMAKER_HOST_METRICS.items()
                if fld in SAGEMAKER_HOST_METRICS_READ
            }
        )
        idle = _agent_search(contract.LOG_IDLE_SECONDS, job_dim, "Maximum", hosts_period)
        return _beyond_one_search(replace(reads, log_idle=idle), facts)

    def _beyond_search(
        self, facts: JobFacts, reads: _JobReads, found: dict[MetricQuery, dict[str, Series]]
    ) -> dict[MetricRef, tuple[SearchRef, str]]:
        """Named series for the hosts a SEARCH could not return (a job of more than 500 hosts)."""
        hosts = alarms.host_names(facts)
        if len(hosts) <= MAX_SERIES_PER_SEARCH:
            return {}
        extra: dict[MetricRef, tuple[SearchRef, str]] = {}
        named = set(reads.named.values())
        for search in [*reads.agent.values(), *reads.platform.values(), *filter(None, [reads.log_idle])]:
            if len(found.get(search, {})) < MAX_SERIES_PER_SEARCH:
                continue  # not cut short: a host missing from it has no such series
            seen = _by_host(found.get(search, {}), facts.name)
            for host in hosts:
                if host not in seen and (search, host) not in named:
                    extra[search.named(_host_dimensions(search, facts.name, host))] = (search, host)
        return extra

    def _assemble(
        self,
        facts: JobFacts,
        reads: _JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        extra: dict[MetricRef, tuple[SearchRef, str]],
        freshness: dict[str, float],
        now: float,
    ) -> JobSignals:
        searches = [*reads.agent.values(), *reads.platform.values(), *filter(None, [reads.log_idle])]
        per_host = {search: _by_host(found.get(search, {}), facts.name) for search in searches}
        for ref, (search, host) in {**reads.named, **extra}.items():
            per_host[search][host] = found[ref][""]
        hosts: dict[str, HostSignals] = {}
        names = alarms.host_names(facts)
        agent = {name: found[ref][""] for name, ref in reads.job.items()}
        stacks_since = stacks.dumps_since(agent, now - LOOKBACK_SECONDS)  # None: stepping, or no agent
        logs = self._host_logs(facts, names, per_host, reads, freshness, now, stacks_since)
        for host in names:
            log = logs.get(host, HostLog())
            if facts.platform is Platform.EC2:
                platform = {fld: found[ref][""] for (ref_host, fld), ref in reads.instances.items() if ref_host == host}
                platform["gpu_mem_util"] = _percent(platform.pop("gpu_mem_used"), platform.pop("gpu_mem_total"))
            else:  # only what the engine reads (core.reading): the other fields stay empty
                platform = dict.fromkeys(SAGEMAKER_HOST_METRICS, Series())
                platform |= {
                    fld: _divided(per_host[search].get(host, Series()), _sagemaker_divisor(facts, host, fld))
                    for fld, search in reads.platform.items()
                }
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

    def ec2_log_freshness(self, facts: JobFacts) -> dict[str, float]:
        """Each EC2 host's newest log event time, from its streams (named by instance id) in the job's log group."""
        hosts = set(facts.instance_ids)
        return _newest(self.ec2_streams(facts), lambda stream: _ec2_host(stream, hosts))

    def ec2_streams(self, facts: JobFacts) -> list[dict[str, Any]]:
        """The job's hosts' log streams (``i-...`` or ``i-.../<file>``) in its log group.

        The group's most recently written streams first (one call for a job whose hosts log), then one call by prefix
        for each host not among them (quiet for long, never logged, or a group shared by many busy jobs): a group
        that keeps the streams of instances long gone is never listed whole."""
        hosts = set(facts.instance_ids)
        group = facts.log_group or self.ec2_log_group
        logs = self.clients.logs
        request: dict[str, Any] = {"logGroupName": group, "orderBy": "LastEventTime", "descending": True}
        found: list[dict[str, Any]] = []
        try:
            for _ in range(RECENT_STREAM_PAGES):
                page = logs.describe_log_streams(**request)
                found += [s for s in page["logStreams"] if _ec2_host(s["logStreamName"], hosts)]
                if not page.get("nextToken") or hosts <= {_ec2_host(s["logStreamName"], hosts) for s in found}:
                    break
                request["nextToken"] = page["nextToken"]
        except logs.exceptions.ResourceNotFoundException:
            return []
        missing = hosts - {_ec2_host(s["logStreamName"], hosts) for s in found}
        streams = [s for host in sorted(missing) for s in self._streams(group, host)]
        return found + [s for s in streams if _ec2_host(s["logStreamName"], hosts)]

    def _streams(self, log_group: str, prefix: str | None) -> list[dict[str, Any]]:
        paginator = self.clients.logs.get_paginator("describe_log_streams")
        request = {"logGroupName": log_group} | ({"logStreamNamePrefix": prefix} if prefix else {})
        try:
            return [s for page in paginator.paginate(**request) for s in page["logStreams"]]
        except self.clients.logs.exceptions.ResourceNotFoundException:
            return []

    def _host_logs(
        self,
        facts: JobFacts,
        hosts: list[str],
        per_host: dict[MetricQuery, dict[str, Series]],
        reads: _JobReads,
        freshness: dict[str, float],
        now: float,
        stacks_since: float | None = None,
    ) -> dict[str, HostLog]:
        """Hosts' log tails (and, with `stacks_since`, the agent's stack dumps since then). SageMaker: each host's
        newest event as the sweeper last published it (its `LogIdleSeconds`) or as the caller knows it, raised by the
        lines read."""
        effective = self.policy.for_job(facts.tags)
        patterns = effective.line_patterns
        if facts.platform is Platform.EC2:
            return self._ec2_host_logs(facts, now, patterns, stacks_since)
        if reads.log_idle is None:
            return {}
        period = reads.log_idle.period or effective.thresholds.alarm_period_seconds
        known = {
            host: min(t + period - idle, now)  # the datapoint's period holds the publication: its end is an upper bound
            for host, series in per_host[reads.log_idle].items()
            if series.points
            for t, idle in [series.points[-1]]
        }
        for host, t in freshness.items():
            known[host] = max(known.get(host, t), t)
        return read_tails(self.clients.logs, facts.name, hosts, known, now, patterns, stacks_since)

    def _ec2_host_logs(
        self, facts: JobFacts, now: float, patterns: log_patterns.LinePatterns, stacks_since: float | None = None
    ) -> dict[str, HostLog]:
        """EC2 hosts' newest event times (their streams), the lines around the quietest host's last event, and the
        agent's stack dumps since `stacks_since`."""
        hosts = set(facts.instance_ids)
        host_of = lambda stream: _ec2_host(stream, hosts)  # noqa: E731 - one line, used twice
        group = facts.log_group or self.ec2_log_group
        found = self.ec2_streams(facts)
        freshness = _newest(found, host_of)
        if not freshness:
            return {}
        streams = [s["logStreamName"] for s in found]
        window = {
            "startTime": max(int((min(freshness.values()) - LOG_TAIL_SECONDS) * 1000), 0),
            "endTime": int(now * 1000),
        }
        logs = {host: HostLog(last_t=t) for host, t in freshness.items()}
        lookback = {"startTime": max(int((now - LOOKBACK_SECONDS) * 1000), 0), "endTime": int(now * 1000)}
        for i in range(0, len(streams), FILTER_STREAMS_LIMIT):
            selection = {"logGroupName": group, "logStreamNames": streams[i : i + FILTER_STREAMS_LIMIT]}
            held = self._read_lines(selection | window, host_of, logs, LOG_TAIL_PAGES, patterns)
            if not held:
                for pattern in patterns.filter_patterns:  # the pages did not reach now: the notable lines alone
                    self._read_lines(selection | lookback | {"filterPattern": pattern}, host_of, logs, 1, patterns)
            if stacks_since is not None and not (held and window["startTime"] <= stacks_since * 1000):
                for line in read_stacks(self.clients.logs, selection, stacks_since, now):  # not all in the pages
                    if (host := host_of(line.stream)) in logs:
                        logs[host].stacks.append(line)
        if stacks_since is not None:  # the pages' dumps (a filtered read's are no lines of the tail)
            for log in logs.values():
                log.stacks += [ln for ln in log.lines if ln.t >= stacks_since and contract.STACKS_MARKER in ln.message]
        for log in logs.values():
            log.lines.sort(key=lambda line: line.t)
            log.notable.sort(key=lambda line: line.t)
        return logs

    def _read_lines(
        self,
        request: dict[str, Any],
        host_of: Callable[[str], str | None],
        logs: dict[str, HostLog],
        pages: int,
        patterns: log_patterns.LinePatterns,
    ) -> bool:
        """FilterLogEvents pages into each host's lines, or, with a `filterPattern`, its notable lines; whether they
        held the whole window."""
        for _ in range(pages):
            response = self.clients.logs.filter_log_events(**request)
            for event in response.get("events", []):
                host = host_of(event["logStreamName"])
                if host not in logs:
                    continue
                message = event["message"].rstrip("\n")
                line = LogLine.read(event["timestamp"] / 1000, event["logStreamName"], message, patterns)
                log = logs[host]
                if "filterPattern" not in request:
                    log.lines.append(line)
                elif line.pattern or line.marker:
                    log.notable.append(line)
                log.last_t = max(log.last_t or line.t, line.t)
            if not response.get("nextToken"):
                return True
            request["nextToken"] = response["nextToken"]
        return False


def _agent_search(
    name: str, job_dim: tuple[tuple[str, str], ...], statistic: str, period: int | None = None
) -> SearchRef:
    """One metric of every host of the job, in the Stallwatch namespace (the agent's, and `LogIdleSeconds`)."""
    return SearchRef(contract.NAMESPACE, name, AGENT_DIMENSIONS, job_dim, statistic, AGENT_LABEL, period=period)


def _by_host(found: dict[str, Series], job: str) -> dict[str, Series]:
    """A SEARCH's series by host, from their labels (``job host``, or SageMaker's ``job/host``); other jobs' series
    (a SEARCH matches phrases, not whole names) are dropped."""
    out: dict[str, Series] = {}
    for label, series in found.items():
        owner, _, host = label.partition(" ") if " " in label else label.partition("/")
        if owner == job and host:
            out[host] = series
    return out


def _host_dimensions(search: SearchRef, job: str, host: str) -> tuple[tuple[str, str], ...]:
    if search.namespace == contract.SAGEMAKER_NAMESPACE:
        return (("Host", f"{job}/{host}"),)
    return ((contract.DIM_JOB, job), (contract.DIM_HOST, host))


def _beyond_one_search(reads: _JobReads, facts: JobFacts) -> _JobReads:
    """A job of more hosts than one SEARCH returns: the first `MAX_SERIES_PER_SEARCH` hosts by SEARCH, the next
    ones (up to `MAX_EXCLUDED_PER_SEARCH`, and as many as keep the SEARCH within CloudWatch's 1,024 characters: fewer
    for a long job name, whose hosts SageMaker names ``<job>/algo-N``) left out of it by name and read by name in the
    same call; any others are read by name after it (`_beyond_search`)."""
    beyond = alarms.host_names(facts)[MAX_SERIES_PER_SEARCH:][:MAX_EXCLUDED_PER_SEARCH]
    if not beyond:
        return reads
    named: dict[MetricRef, tuple[SearchRef, str]] = {}

    def split(search: SearchRef) -> SearchRef:
        def host_dimension(host: str) -> tuple[str, str]:
            return ("Host", dict(_host_dimensions(search, facts.name, host))["Host"])

        excluded = search
        for count in range(1, len(beyond) + 1):
            wider = replace(search, excluded=tuple(host_dimension(host) for host in beyond[:count]))
            if not wider.fits():
                break
            excluded = wider
        for host in beyond[: len(excluded.excluded)]:
            named[excluded.named(_host_dimensions(search, facts.name, host))] = (excluded, host)
        return excluded

    agent = {name: split(search) for name, search in reads.agent.items()}
    platform = {fld: split(search) for fld, search in reads.platform.items()}
    idle = split(reads.log_idle) if reads.log_idle else None
    return replace(reads, agent=agent, platform=platform, log_idle=idle, named=named)


def _ec2_host(stream: str, hosts: set[str]) -> str | None:
    match = EC2_STREAM.match(stream)
    return match["host"] if match and match["host"] in hosts else None


def _newest(streams: list[dict[str, Any]], host_of: Callable[[str], str | None]) -> dict[str, float]:
    """Per host, the newest event time of its streams (epoch seconds)."""
    newest: dict[str, float] = {}
    for stream in streams:
        host = host_of(stream["logStreamName"])
        last_ms = stream.get("lastEventTimestamp") or stream.get("lastIngestionTime")
        if host and last_ms:
            newest[host] = max(newest.get(host, 0.0), last_ms / 1000)
    return newest


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def _sagemaker_divisor(facts: JobFacts, host: str, field_name: str) -> int:
    """SageMaker sums a host's devices: GPU fields over its GPUs, CPU over its vCPUs (the host's own type's)."""
    if field_name == "cpu_util":
        return facts.vcpus_on(host)
    return facts.gpus_on(host) or 1  # a CPU-only host (a heterogeneous cluster's data group) has no GPU data


def _divided(series: Series, divisor: float) -> Series:
    return Series(tuple((t, v / divisor) for t, v in series.points))


def _percent(part: Series, whole: Series) -> Series:
    """100 x part / whole at the timestamps both have."""
    totals = dict(whole.points)
    return Series(tuple((t, 100 * v / totals[t]) for t, v in part.points if totals.get(t)))


def _line_order(line: LogLine) -> tuple[float, str, str]:
    return line.t, line.stream, line.message
