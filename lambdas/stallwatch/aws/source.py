"""Signals from AWS: SageMaker/EC2 facts, CloudWatch metrics (batched GetMetricData) and CloudWatch Logs.

    clients = AwsClients()                                  # lazy boto3 clients, adaptive retries
    source = AwsSignalSource(clients, Platform.SAGEMAKER)
    signals = source.job_signals("my-job", now=time.time())
    batch = source.many_job_signals(["a", "b"], now)        # one GetMetricData call per 500 series

Platform metrics are normalized per device: SageMaker publishes GPU/CPU utilization summed over a host's
devices; EC2 hosts use the CloudWatch agent's nvidia_smi_* metrics aggregated by InstanceId (see docs/lambdas.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from stallwatch.aws.clients import AwsClients
from stallwatch.core import alarms, clusters, contract, log_patterns
from stallwatch.core.config import EC2_LOG_GROUP
from stallwatch.core.policy import EC2_MONITOR_TAG, Policy
from stallwatch.core.pricing import instance_spec
from stallwatch.core.reading import (
    AGENT_STATISTICS,
    EC2_STREAM,
    ERROR_LINES_PER_HOST,
    FILTER_STREAMS_LIMIT,
    LOG_LINES_PER_HOST,
    LOG_TAIL_SECONDS,
    LOOKBACK_SECONDS,
    METRIC_PERIOD_SECONDS,
    SAGEMAKER_STREAM,
)
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Platform, Series

MAX_QUERIES_PER_CALL = 500  # GetMetricData limit
LOG_TAIL_PAGES = 2
RECENT_STREAM_PAGES = 2  # EC2: pages of a log group's most recently written streams read before asking per host

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
class MetricRef:
    """One series to read: where it lives, how to aggregate it, and what to divide it by."""

    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]
    statistic: str = "Average"
    divisor: float = 1.0

    def query(self, query_id: str, period: int) -> dict[str, Any]:
        metric = {
            "Namespace": self.namespace,
            "MetricName": self.name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in self.dimensions],
        }
        return {"Id": query_id, "MetricStat": {"Metric": metric, "Period": period, "Stat": self.statistic}}


def read_series(
    cloudwatch: Any, refs: list[MetricRef], start: float, end: float, period: int = METRIC_PERIOD_SECONDS
) -> dict[MetricRef, Series]:
    """Datapoints of every ref, oldest first, in as few GetMetricData calls as the 500-query limit allows."""
    out: dict[MetricRef, Series] = {}
    unique = list(dict.fromkeys(refs))
    for offset in range(0, len(unique), MAX_QUERIES_PER_CALL):
        chunk = unique[offset : offset + MAX_QUERIES_PER_CALL]
        points: dict[str, list[tuple[float, float]]] = {f"q{i}": [] for i in range(len(chunk))}
        request = {
            "MetricDataQueries": [ref.query(f"q{i}", period) for i, ref in enumerate(chunk)],
            "StartTime": datetime.fromtimestamp(start, UTC),
            "EndTime": datetime.fromtimestamp(end, UTC),
            "ScanBy": "TimestampAscending",
        }
        while True:
            response = cloudwatch.get_metric_data(**request)
            for result in response["MetricDataResults"]:
                points[result["Id"]].extend(
                    (ts.timestamp(), value) for ts, value in zip(result["Timestamps"], result["Values"], strict=True)
                )
            if not response.get("NextToken"):
                break
            request["NextToken"] = response["NextToken"]
        for i, ref in enumerate(chunk):
            series = sorted(points[f"q{i}"])
            out[ref] = Series(tuple((t, v / ref.divisor) for t, v in series))
    return out


@dataclass(frozen=True)
class _JobRefs:
    """The metric refs of one job, keyed by what the signals need."""

    job: dict[str, MetricRef] = field(default_factory=dict)  # JOB_METRICS name -> ref
    platform: dict[tuple[str, str], MetricRef] = field(default_factory=dict)  # (host, HostSignals field) -> ref
    # (host, HOST_METRICS name) -> ref; on SageMaker also (host, LOG_IDLE_SECONDS): the sweeper's sawtooth
    agent: dict[tuple[str, str], MetricRef] = field(default_factory=dict)

    def all(self) -> Iterator[MetricRef]:
        yield from self.job.values()
        yield from self.platform.values()
        yield from self.agent.values()


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

    def job_signals(self, job_name: str, now: float) -> JobSignals:
        return self.many_job_signals([job_name], now)[job_name]

    def many_job_signals(self, job_names: Iterable[str], now: float) -> dict[str, JobSignals]:
        """Signals of several jobs; their metrics are read together, 500 series per GetMetricData call."""
        facts = {name: self.facts(name) for name in job_names}
        refs = {name: self._refs(f) for name, f in facts.items()}
        start = now - LOOKBACK_SECONDS
        by_period: dict[int, list[MetricRef]] = defaultdict(list)
        for name, job_facts in facts.items():
            by_period[self.policy.for_job(job_facts.tags).thresholds.alarm_period_seconds].extend(refs[name].all())
        series: dict[MetricRef, Series] = {}
        for period, wanted in by_period.items():
            series |= read_series(self.clients.cloudwatch, wanted, start, now, period)
        return {name: self._assemble(facts[name], refs[name], series, now) for name in facts}

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
        """An EC2 job: the instances tagged `stallwatch:job=<job_name>`, or the untagged instance `job_name`."""
        if not clusters.INSTANCE_ID.match(job_name):
            instances = self._describe_instances(Filters=[{"Name": f"tag:{clusters.JOB_TAG}", "Values": [job_name]}])
            if not instances:
                raise JobNotFoundError(f"no EC2 instance is tagged {clusters.JOB_TAG}={job_name!r}")
            return self._ec2_group_facts(job_name, instances)
        instance = self.ec2_instance(job_name)
        owner = clusters.job_of(_tags(instance), job_name)
        if owner not in (None, job_name):
            raise JobNotFoundError(f"EC2 instance {job_name!r} belongs to job {owner!r}")
        return self._ec2_group_facts(job_name, [instance])

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

    def _refs(self, facts: JobFacts) -> _JobRefs:
        job_dim = ((contract.DIM_JOB, facts.name),)
        refs = _JobRefs(
            job={
                name: MetricRef(contract.NAMESPACE, name, job_dim, AGENT_STATISTICS.get(name, "Average"))
                for name in contract.JOB_METRICS
            }
        )
        for host in alarms.host_names(facts):
            host_dims = (*job_dim, (contract.DIM_HOST, host))
            for name in contract.HOST_METRICS:
                statistic = AGENT_STATISTICS.get(name, "Average")
                refs.agent[host, name] = MetricRef(contract.NAMESPACE, name, host_dims, statistic)
            refs.platform.update(self._platform_refs(facts, host))
            if facts.platform is Platform.SAGEMAKER:
                log_idle = contract.LOG_IDLE_SECONDS
                refs.agent[host, log_idle] = MetricRef(
                    contract.NAMESPACE, log_idle, host_dims, AGENT_STATISTICS[log_idle]
                )
        return refs

    def _platform_refs(self, facts: JobFacts, host: str) -> dict[tuple[str, str], MetricRef]:
        if facts.platform is Platform.SAGEMAKER:
            dims = (("Host", f"{facts.name}/{host}"),)
            gpus = facts.gpus_on(host) or 1  # a CPU-only host (a heterogeneous cluster's data group) has no GPU data
            divisors = {"gpu_util": gpus, "gpu_mem_util": gpus}
            return {
                (host, fld): MetricRef(
                    contract.SAGEMAKER_NAMESPACE, name, dims, divisor=divisors.get(fld, facts.vcpus_on(host))
                )
                for fld, name in SAGEMAKER_HOST_METRICS.items()
            }
        dims = ((alarms.CWAGENT_DIM_INSTANCE, host),)
        return {(host, fld): MetricRef(ns, name, dims) for fld, (ns, name) in EC2_HOST_METRICS.items()}

    def _assemble(self, facts: JobFacts, refs: _JobRefs, series: dict[MetricRef, Series], now: float) -> JobSignals:
        logs = self.host_logs(facts, now)
        hosts: dict[str, HostSignals] = {}
        for host in alarms.host_names(facts):
            log = logs.get(host, _HostLog())
            platform = {fld: series[ref] for (ref_host, fld), ref in refs.platform.items() if ref_host == host}
            if "gpu_mem_used" in platform:
                platform["gpu_mem_util"] = _percent(platform.pop("gpu_mem_used"), platform.pop("gpu_mem_total"))
            hosts[host] = HostSignals(
                host=host,
                gpu_util=platform["gpu_util"],
                gpu_mem_util=platform["gpu_mem_util"],
                cpu_util=platform["cpu_util"],
                agent={name: series[refs.agent[host, name]] for name in contract.HOST_METRICS},
                log_last_t=log.last_t,
                log_tail=tuple(log.lines[-LOG_LINES_PER_HOST:]),
                error_lines=tuple([line for line in log.lines if line.pattern][-ERROR_LINES_PER_HOST:]),
                log_idle=series[idle_ref]
                if (idle_ref := refs.agent.get((host, contract.LOG_IDLE_SECONDS)))
                else Series(),
            )
        agent = {name: series[ref] for name, ref in refs.job.items()}
        return JobSignals(facts=facts, now=now, hosts=hosts, agent=agent)

    def log_freshness(self, job_name: str) -> dict[str, float]:
        """Each SageMaker host's newest log event time (epoch seconds), from its log streams."""
        streams = self._streams(contract.SAGEMAKER_LOG_GROUP, f"{job_name}/")
        return _newest(streams, lambda stream: _sagemaker_host(stream, job_name))

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

    def host_logs(self, facts: JobFacts, now: float) -> dict[str, _HostLog]:
        """Per host: the newest event time and the log lines around the quietest host's last event."""
        if facts.platform is Platform.SAGEMAKER:
            freshness = self.log_freshness(facts.name)
            host_of = lambda stream: _sagemaker_host(stream, facts.name)  # noqa: E731 - one line, used twice
            selections = [{"logGroupName": contract.SAGEMAKER_LOG_GROUP, "logStreamNamePrefix": f"{facts.name}/"}]
        else:
            hosts = set(facts.instance_ids)
            host_of = lambda stream: _ec2_host(stream, hosts)  # noqa: E731
            group = facts.log_group or self.ec2_log_group
            found = self.ec2_streams(facts)
            freshness = _newest(found, host_of)
            streams = [s["logStreamName"] for s in found]
            selections = [
                {"logGroupName": group, "logStreamNames": streams[i : i + FILTER_STREAMS_LIMIT]}
                for i in range(0, len(streams), FILTER_STREAMS_LIMIT)
            ]
        if not freshness:
            return {}
        window = {
            "startTime": max(int((min(freshness.values()) - LOG_TAIL_SECONDS) * 1000), 0),
            "endTime": int(now * 1000),
        }
        logs = {host: _HostLog(last_t=t) for host, t in freshness.items()}
        for selection in selections:
            self._read_lines(selection | window, host_of, logs)
        for log in logs.values():
            log.lines.sort(key=lambda line: line.t)
        return logs

    def _read_lines(
        self, request: dict[str, Any], host_of: Callable[[str], str | None], logs: dict[str, _HostLog]
    ) -> None:
        for _ in range(LOG_TAIL_PAGES):
            response = self.clients.logs.filter_log_events(**request)
            for event in response.get("events", []):
                host = host_of(event["logStreamName"])
                if host not in logs:
                    continue
                t = event["timestamp"] / 1000
                message = event["message"].rstrip("\n")
                log = logs[host]
                log.lines.append(LogLine(t, event["logStreamName"], message, log_patterns.match(message)))
                log.last_t = max(log.last_t or t, t)
            if not response.get("nextToken"):
                break
            request["nextToken"] = response["nextToken"]


def _sagemaker_host(stream: str, job_name: str) -> str | None:
    match = SAGEMAKER_STREAM.match(stream)
    return match["host"] if match and match["job"] == job_name else None


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


def _percent(part: Series, whole: Series) -> Series:
    """100 x part / whole at the timestamps both have."""
    totals = dict(whole.points)
    return Series(tuple((t, 100 * v / totals[t]) for t, v in part.points if totals.get(t)))


@dataclass
class _HostLog:
    last_t: float | None = None
    lines: list[LogLine] = field(default_factory=list)
