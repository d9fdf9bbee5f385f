"""Export a real SageMaker training job or EC2 instance into trace format v1, to backtest Stallwatch before enforcing.

    stallwatch export-trace my-job --region us-east-1 --out my-job.jsonl
    stallwatch export-trace i-0123456789abcdef0 --out my-host.jsonl    # an EC2 instance: JOB is its id
    stallwatch replay my-job.jsonl

A SageMaker job: the job (DescribeTrainingJob: instance type and count, secondary status history, times), its tags,
its 1-minute metrics (GetMetricData, up to 500 series per call: the SageMaker host metrics and the agent's
Stallwatch metrics) and its logs (FilterLogEvents on ``/aws/sagemaker/TrainingJobs``, streams
``<job>/algo-N-<epoch>``). An EC2 job is named by its instance id, as the control plane names it: the instance
(DescribeInstances: type, tags, LaunchTime as t = 0, its stop time when it is no longer running), the CloudWatch
agent's ``nvidia_smi_*`` metrics and ``AWS/EC2`` CPUUtilization by InstanceId, and the agent's Stallwatch metrics
(JobName = the instance id). EC2 traces carry no log lines: the control plane reads no EC2 logs.
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
from stallwatch.aws.source import EC2_HOST_METRICS, SAGEMAKER_HOST_METRICS, AwsSignalSource, JobNotFoundError
from stallwatch.core import contract
from stallwatch.core.alarms import CWAGENT_DIM_INSTANCE, host_names
from stallwatch.core.pricing import instance_spec
from stallwatch.core.reading import AGENT_STATISTICS, METRIC_PERIOD_SECONDS
from stallwatch.core.signals import JobFacts, Platform
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
# How the control plane names an EC2 job (as the EC2 state-change events spell instance ids).
EC2_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
# DescribeInstances' StateTransitionReason of a stopped instance: "User initiated (2025-06-01 12:00:00 GMT)".
EC2_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


class ExportError(ValueError):
    """The job cannot be exported: SageMaker or EC2 does not know it."""


def platform_of(job_name: str) -> Platform:
    """EC2 for an instance id (``i-`` and 8 to 17 hex digits, as EC2 events spell it), else SageMaker.

    >>> platform_of("i-0123456789abcdef0"), platform_of("llm-7b")
    (<Platform.EC2: 'ec2'>, <Platform.SAGEMAKER: 'sagemaker'>)
    """
    return Platform.EC2 if EC2_INSTANCE_ID.match(job_name) else Platform.SAGEMAKER


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _platform_refs(job: TraceJob, host: str) -> list[MetricRef]:
    """The host's platform metrics, raw: the replay normalizes them per device, as `aws.source` does."""
    if job.platform is Platform.SAGEMAKER:
        dims = (("Host", f"{job.name}/{host}"),)
        return [MetricRef(contract.SAGEMAKER_NAMESPACE, name, dims) for name in SAGEMAKER_HOST_METRICS.values()]
    dims = ((CWAGENT_DIM_INSTANCE, host),)
    return [MetricRef(namespace, name, dims) for namespace, name in EC2_HOST_METRICS.values()]


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
    )
    job_dims = ((contract.DIM_JOB, job.name),)
    refs = [
        MetricRef(contract.NAMESPACE, name, job_dims, AGENT_STATISTICS.get(name, "Average"))
        for name in contract.JOB_METRICS
    ]
    for host in host_names(facts):
        refs += _platform_refs(job, host)
        host_dims = (*job_dims, (contract.DIM_HOST, host))
        refs += [
            MetricRef(contract.NAMESPACE, name, host_dims, AGENT_STATISTICS.get(name, "Average"))
            for name in contract.HOST_METRICS
        ]
    return refs


def _log_events(logs: Any, job_name: str, start: float, end: float) -> list[LogEvent]:
    """Every log line of the job's streams in [start, end], as events relative to `start`."""
    paginator = logs.get_paginator("filter_log_events")
    pages = paginator.paginate(
        logGroupName=contract.SAGEMAKER_LOG_GROUP,
        logStreamNamePrefix=f"{job_name}/",
        startTime=int(start * 1000),
        endTime=int(end * 1000),
    )
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
    job_name: str, clients: AwsClients, out: str | Path | TextIO | None = None, until: float | None = None
) -> Trace:
    """Read `job_name` (a SageMaker training job, or an EC2 instance id) into a trace; write it to `out` if given.

    The trace spans the job's start (t = 0: a SageMaker job's creation, an EC2 instance's LaunchTime) to its end,
    or to `until` (epoch seconds; default: now while it runs).
    """
    if platform_of(job_name) is Platform.EC2:
        return _export_ec2(job_name, clients, out, until)
    return _export_sagemaker(job_name, clients, out, until)


def _export_sagemaker(
    job_name: str, clients: AwsClients, out: str | Path | TextIO | None, until: float | None
) -> Trace:
    """A SageMaker training job: status history, metrics and logs, from its creation."""
    sagemaker = clients.sagemaker
    try:
        described = sagemaker.describe_training_job(TrainingJobName=job_name)
    except sagemaker.exceptions.ClientError as exc:
        raise ExportError(f"training job {job_name!r}: {exc.response['Error']['Message']}") from exc
    tags = sagemaker.list_tags(ResourceArn=described["TrainingJobArn"]).get("Tags", [])
    resources = described["ResourceConfig"]
    spec = instance_spec(resources["InstanceType"])
    job = TraceJob(
        name=job_name,
        platform=Platform.SAGEMAKER,
        instance_type=resources["InstanceType"],
        instance_count=resources["InstanceCount"],
        gpus_per_host=spec.devices,
        vcpus_per_host=spec.vcpus,
        tags={t["Key"]: t["Value"] for t in tags},
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
    events += _log_events(clients.logs, job_name, start, end)
    if ended is not None and ended <= end:
        events.append(StatusEvent(t=max(0.0, ended - start), status=status, secondary=described.get("SecondaryStatus")))
    return _finish(job, events, end - start, f"exported from SageMaker ({status})", out)


def _ec2_stop_time(clients: AwsClients, instance_id: str) -> float | None:
    """When a no-longer-running instance stopped, from its StateTransitionReason; None if it does not say."""
    reservations = clients.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    reason = next((i.get("StateTransitionReason", "") for r in reservations for i in r["Instances"]), "")
    match = EC2_TRANSITION_TIME.search(reason or "")
    if match is None:
        return None
    return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _export_ec2(instance_id: str, clients: AwsClients, out: str | Path | TextIO | None, until: float | None) -> Trace:
    """An EC2 instance, from its LaunchTime: the metrics the control plane reads (no logs: it reads none on EC2)."""
    try:
        facts = AwsSignalSource(clients, Platform.EC2).facts(instance_id)
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
    )
    start = facts.start_time
    # Only a stopped instance needs its stop time, which the facts do not carry.
    ended = _ec2_stop_time(clients, instance_id) if facts.status != RUNNING else None
    end = _end_of(start, until, ended)

    events: list[Event] = [StatusEvent(t=0.0, status=RUNNING)]
    events += _metric_events(clients.cloudwatch, job, start, end)
    if facts.status != RUNNING and (ended is None or ended <= end):
        # Without a stop time the instance is known stopped only by the end of the trace.
        events.append(StatusEvent(t=max(0.0, (ended or end) - start), status=facts.status))
    return _finish(job, events, end - start, f"exported from EC2 ({facts.status})", out)
