"""Export a real SageMaker training job or EC2 job into trace format v1, to backtest Stallwatch before enforcing.

    stallwatch export-trace my-job --region us-east-1 --out my-job.jsonl
    stallwatch export-trace llm-70b --platform ec2 --out llm-70b.jsonl   # the instances tagged stallwatch:job=llm-70b
    stallwatch export-trace i-0123456789abcdef0 --out my-host.jsonl      # a one-instance EC2 job: JOB is its id
    stallwatch replay my-job.jsonl

A SageMaker job: the job (DescribeTrainingJob: instance type and count, or a heterogeneous cluster's instance groups,
secondary status history, times), its tags, its 1-minute metrics (GetMetricData, up to 500 series per call: the
SageMaker host metrics and the agent's Stallwatch metrics) and its logs (FilterLogEvents on
``/aws/sagemaker/TrainingJobs``, streams ``<job>/algo-N-<epoch>``). An EC2 job is named as the control plane names
it: its ``stallwatch:job`` tag (every instance carrying it), or the id of an untagged instance. It is read from
DescribeInstances (types, tags, the earliest LaunchTime as t = 0, the latest stop time once none runs), the
CloudWatch agent's ``nvidia_smi_*`` metrics and ``AWS/EC2`` CPUUtilization by InstanceId, the agent's Stallwatch
metrics (JobName = the job) and the instances' log streams (named by instance id) in the job's log group.
CloudWatch keeps 1-minute datapoints for 15 days: export within that.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.metric_reads import MetricRef, read_series
from stallwatch.aws.platforms import adapter
from stallwatch.aws.resume import describe_training_job
from stallwatch.aws.source import JobNotFoundError
from stallwatch.core import clusters, contract
from stallwatch.core.alarms import host_names
from stallwatch.core.config import EC2_LOG_GROUP, StallwatchConfig
from stallwatch.core.platforms import describe
from stallwatch.core.pricing import instance_spec
from stallwatch.core.reading import AGENT_STATISTICS, FILTER_STREAMS_LIMIT, METRIC_PERIOD_SECONDS
from stallwatch.core.signals import JobFacts, Platform, Series
from stallwatch.core.trace import (
    EndEvent,
    Event,
    LogEvent,
    LogRecord,
    MetricDatum,
    MetricEvent,
    StatusEvent,
    Trace,
    TraceHeader,
    TraceJob,
)
from stallwatch.offline.trace_file import write_trace

RUNNING = "InProgress"
# Secondary statuses that end the job; the trace carries the job's final status once, at its end.
FINAL_SECONDARY = frozenset({"Completed", "Failed", "Stopping", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded"})
# DescribeInstances' StateTransitionReason of a stopped instance: "User initiated (2025-06-01 12:00:00 GMT)".
EC2_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


class ExportError(ValueError):
    """The job cannot be exported: SageMaker or EC2 does not know it."""


def platform_of(job_name: str) -> Platform:
    """EC2 for an instance id (``i-`` and 8 to 17 hex digits, as EC2 events spell it), else SageMaker.

    >>> platform_of("i-0123456789abcdef0"), platform_of("llm-7b")
    (<Platform.EC2: 'ec2'>, <Platform.SAGEMAKER: 'sagemaker'>)
    """
    return Platform.EC2 if clusters.INSTANCE_ID.match(job_name) else Platform.SAGEMAKER


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _platform_refs(facts: JobFacts, host: str) -> list[MetricRef]:
    """The host's platform metrics, raw (the replay normalizes them per device, as the adapters do): the series its
    platform's description reads."""
    refs: list[MetricRef] = []

    def record(namespace: str, name: str, dimensions: dict[str, str], divisor: float) -> Series:
        refs.append(MetricRef(namespace, name, tuple(dimensions.items())))
        return Series()

    describe(facts.platform).host_series(facts, host, record)
    return refs


def _metric_refs(job: TraceJob) -> list[MetricRef]:
    """Every series the replay reads: platform host metrics, and the agent's job and host metrics."""
    facts = JobFacts(
        name=job.name,
        platform=job.platform,
        status=RUNNING,
        secondary_status=None,
        start_time=0.0,
        instance_type=job.instance_type,
        instance_count=job.instance_count,
        gpus_per_host=job.gpus_per_host,
        vcpus_per_host=job.vcpus_per_host,
        instance_ids=tuple(job.instance_ids),
        host_types=dict(job.host_types or {}),
    )
    job_dims = ((contract.DIM_JOB, job.name),)
    refs = [
        MetricRef(contract.NAMESPACE, name, job_dims, AGENT_STATISTICS.get(name, "Average"))
        for name in contract.JOB_METRICS
    ]
    for host in host_names(facts):
        refs += _platform_refs(facts, host)
        host_dims = (*job_dims, (contract.DIM_HOST, host))
        refs += [
            MetricRef(contract.NAMESPACE, name, host_dims, AGENT_STATISTICS.get(name, "Average"))
            for name in contract.HOST_METRICS
        ]
    return refs


def _log_events(logs: Any, selection: dict[str, Any], start: float, end: float) -> list[LogEvent]:
    """Every log line of the selected streams (`logGroupName` and a stream prefix or names) in [start, end], as
    events relative to `start`."""
    paginator = logs.get_paginator("filter_log_events")
    pages = paginator.paginate(**selection, startTime=int(start * 1000), endTime=int(end * 1000))
    events = []
    try:
        for page in pages:
            for e in page.get("events", []):
                record = LogRecord(stream=e["logStreamName"], message=e["message"].rstrip("\n"))
                events.append(LogEvent(t=max(0.0, e["timestamp"] / 1000 - start), log=record))
    except logs.exceptions.ResourceNotFoundException:
        return []  # the job never wrote a log line
    return events


def _metric_events(cloudwatch: Any, job: TraceJob, start: float, end: float) -> list[MetricEvent]:
    """The job's 1-minute datapoints in [start, end], as events relative to `start`."""
    # Whole periods: the first one began before the job did, and GetMetricData refuses an empty window.
    first = math.floor(start / METRIC_PERIOD_SECONDS) * METRIC_PERIOD_SECONDS
    last = max(first + METRIC_PERIOD_SECONDS, math.ceil(end / METRIC_PERIOD_SECONDS) * METRIC_PERIOD_SECONDS)
    events = []
    for ref, points in read_series(cloudwatch, _metric_refs(job), first, last).items():
        dims = dict(ref.dimensions)
        events += [
            MetricEvent(
                t=max(0.0, t - start),
                metric=MetricDatum(namespace=ref.namespace, name=ref.name, dimensions=dims, value=v),
            )
            for t, v in points.points
        ]
    return events


def _end_of(start: float, until: float | None, ended: float | None) -> float:
    """Where the trace ends: `until` if given, else when the job ended, else now; never before `start`."""
    return max(start, until if until is not None else (ended or datetime.now(UTC).timestamp()))


def _finish(job: TraceJob, events: list[Event], span: float, scenario: str, out: str | Path | TextIO | None) -> Trace:
    """Sort the events, drop those after `span`, close with the end event; write the trace to `out` if given."""
    events = sorted((e for e in events if e.t <= span), key=lambda e: e.t)
    events.append(EndEvent(t=max([span, *(e.t for e in events)]), end=True))
    header = TraceHeader(stallwatch_trace=1, job=job, scenario=scenario)
    if out is not None:
        write_trace(header, events, out)
    return Trace(header=header, events=tuple(events), source=str(out) if isinstance(out, str | Path) else job.name)


def export_trace(
    job_name: str,
    clients: AwsClients,
    out: str | Path | TextIO | None = None,
    until: float | None = None,
    platform: Platform | None = None,
    ec2_log_group: str = EC2_LOG_GROUP,
) -> Trace:
    """Read `job_name` into a trace; write it to `out` if given. The platform is `platform`, else EC2 for an
    instance id and SageMaker for any other name (an EC2 job named by its `stallwatch:job` tag needs `platform`).

    The trace spans the job's start (t = 0: a SageMaker job's creation, an EC2 job's first LaunchTime) to its end,
    or to `until` (epoch seconds; default: now while it runs).
    """
    if (platform or platform_of(job_name)) is Platform.EC2:
        return _export_ec2(job_name, clients, out, until, ec2_log_group)
    return _export_sagemaker(job_name, clients, out, until)


def _export_sagemaker(
    job_name: str, clients: AwsClients, out: str | Path | TextIO | None, until: float | None
) -> Trace:
    """A SageMaker training job: status history, metrics and logs, from its creation."""
    try:
        described, tags = describe_training_job(clients, job_name)
    except clients.sagemaker.exceptions.ClientError as exc:
        raise ExportError(f"training job {job_name!r}: {exc.response['Error']['Message']}") from exc
    layout = clusters.sagemaker_layout(described["ResourceConfig"])
    spec = instance_spec(layout.instance_type)
    job = TraceJob(
        name=job_name,
        platform=Platform.SAGEMAKER,
        instance_type=layout.instance_type,
        instance_count=layout.instance_count,
        gpus_per_host=spec.devices,
        vcpus_per_host=spec.vcpus,
        tags=tags,
        host_types=layout.host_types or None,
    )
    start = described["CreationTime"].timestamp()
    status = described["TrainingJobStatus"]
    ended = _epoch(described.get("TrainingEndTime")) if status != RUNNING else None
    end = _end_of(start, until, ended)

    events: list[Event] = [
        StatusEvent(
            t=max(0.0, transition["StartTime"].timestamp() - start), status=RUNNING, secondary=transition["Status"]
        )
        for transition in described.get("SecondaryStatusTransitions", [])
        if transition["Status"] not in FINAL_SECONDARY
    ]
    events += _metric_events(clients.cloudwatch, job, start, end)
    selection = {"logGroupName": contract.SAGEMAKER_LOG_GROUP, "logStreamNamePrefix": f"{job_name}/"}
    events += _log_events(clients.logs, selection, start, end)
    if ended is not None and ended <= end:
        events.append(StatusEvent(t=max(0.0, ended - start), status=status, secondary=described.get("SecondaryStatus")))
    return _finish(job, events, end - start, f"exported from SageMaker ({status})", out)


def _ec2_stop_time(instance: dict[str, Any]) -> float | None:
    """When a no-longer-running instance stopped, from its StateTransitionReason; None if it does not say."""
    match = EC2_TRANSITION_TIME.search(instance.get("StateTransitionReason") or "")
    if match is None:
        return None
    return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _export_ec2(
    job_name: str, clients: AwsClients, out: str | Path | TextIO | None, until: float | None, ec2_log_group: str
) -> Trace:
    """An EC2 job (its instances), from the first LaunchTime: the metrics and log lines the control plane reads."""
    source = adapter(Platform.EC2, clients, StallwatchConfig(ec2_log_group=ec2_log_group))
    try:
        facts = source.facts(job_name)
    except JobNotFoundError as exc:
        raise ExportError(str(exc)) from exc
    job = TraceJob(
        name=facts.name,
        platform=Platform.EC2,
        instance_type=facts.instance_type,
        instance_count=facts.instance_count,
        gpus_per_host=facts.gpus_per_host,
        vcpus_per_host=facts.vcpus_per_host,
        tags=dict(facts.tags),
        instance_ids=list(facts.instance_ids),
        host_types=dict(facts.host_types) or None,
    )
    start = facts.start_time
    ended = None
    if facts.status != RUNNING:  # only a stopped job needs its stop time, which the facts do not carry
        stops = [_ec2_stop_time(source.instance(i)) for i in facts.instance_ids]
        ended = max(stops) if stops and None not in stops else None
    end = _end_of(start, until, ended)

    events: list[Event] = [StatusEvent(t=0.0, status=RUNNING)]
    events += _metric_events(clients.cloudwatch, job, start, end)
    group = facts.log_group or ec2_log_group
    streams = [s["logStreamName"] for s in source.log_streams(facts)]
    for offset in range(0, len(streams), FILTER_STREAMS_LIMIT):
        selection = {"logGroupName": group, "logStreamNames": streams[offset : offset + FILTER_STREAMS_LIMIT]}
        events += _log_events(clients.logs, selection, start, end)
    if facts.status != RUNNING and (ended is None or ended <= end):
        # Without a stop time the job is known stopped only by the end of the trace.
        events.append(StatusEvent(t=max(0.0, (ended or end) - start), status=facts.status))
    return _finish(job, events, end - start, f"exported from EC2 ({facts.status})", out)
