"""Export a real SageMaker training job into trace format v1, to backtest Stallwatch on it before enforcing.

    stallwatch export-trace my-job --region us-east-1 --out my-job.jsonl
    stallwatch replay my-job.jsonl

It reads the job (DescribeTrainingJob: instance type and count, secondary status history, times), its tags,
its 1-minute metrics (GetMetricData, up to 500 series per call: the SageMaker host metrics and the agent's
Stallwatch metrics) and its logs (FilterLogEvents on ``/aws/sagemaker/TrainingJobs``, streams
``<job>/algo-N-<epoch>``). CloudWatch keeps 1-minute datapoints for 15 days: export within that.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from stallwatch import contract
from stallwatch.alarms import host_names
from stallwatch.aws_source import (
    AGENT_STATISTICS,
    METRIC_PERIOD_SECONDS,
    SAGEMAKER_HOST_METRICS,
    AwsClients,
    MetricRef,
    read_series,
)
from stallwatch.pricing import instance_spec
from stallwatch.signals import JobFacts, Platform
from stallwatch.trace import (
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
    write_trace,
)

RUNNING = "InProgress"
# Secondary statuses that end the job; the trace carries the job's final status once, at its end.
FINAL_SECONDARY = frozenset({"Completed", "Failed", "Stopping", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded"})


class ExportError(ValueError):
    """The job cannot be exported: SageMaker does not know it."""


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


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
    )
    job_dims = ((contract.DIM_JOB, job.name),)
    refs = [
        MetricRef(contract.NAMESPACE, name, job_dims, AGENT_STATISTICS.get(name, "Average"))
        for name in contract.JOB_METRICS
    ]
    for host in host_names(facts):
        refs += [
            MetricRef(contract.SAGEMAKER_NAMESPACE, name, (("Host", f"{job.name}/{host}"),))
            for name in SAGEMAKER_HOST_METRICS.values()
        ]
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


def export_trace(
    job_name: str, clients: AwsClients, out: str | Path | TextIO | None = None, until: float | None = None
) -> Trace:
    """Read `job_name` from SageMaker, CloudWatch and CloudWatch Logs into a trace; write it to `out` if given.

    The trace spans the job's creation (t = 0) to its end, or to `until` (epoch seconds; default: now while it runs).
    """
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
    end = max(start, until if until is not None else (ended or datetime.now(UTC).timestamp()))

    events: list[Event] = [
        StatusEvent(
            t=max(0.0, transition["StartTime"].timestamp() - start), status=RUNNING, secondary=transition["Status"]
        )
        for transition in described.get("SecondaryStatusTransitions", [])
        if transition["Status"] not in FINAL_SECONDARY
    ]
    # Whole periods: the first one began before the job did, and GetMetricData refuses an empty window.
    first = math.floor(start / METRIC_PERIOD_SECONDS) * METRIC_PERIOD_SECONDS
    last = max(first + METRIC_PERIOD_SECONDS, math.ceil(end / METRIC_PERIOD_SECONDS) * METRIC_PERIOD_SECONDS)
    for ref, points in read_series(clients.cloudwatch, _metric_refs(job), first, last).items():
        dims = dict(ref.dimensions)
        events += [
            MetricEvent(
                t=max(0.0, t - start),
                metric=MetricDatum(namespace=ref.namespace, name=ref.name, dimensions=dims, value=v),
            )
            for t, v in points.points
        ]
    events += _log_events(clients.logs, job_name, start, end)
    events = [e for e in events if e.t <= end - start]
    if ended is not None and ended <= end:
        events.append(StatusEvent(t=max(0.0, ended - start), status=status, secondary=described.get("SecondaryStatus")))
    events.sort(key=lambda e: e.t)
    events.append(EndEvent(t=max([end - start, *(e.t for e in events)]), end=True))
    header = TraceHeader(stallwatch_trace=1, job=job, scenario=f"exported from SageMaker ({status})")
    if out is not None:
        write_trace(header, events, out)
    return Trace(header=header, events=tuple(events), source=str(out) if isinstance(out, str | Path) else job_name)
