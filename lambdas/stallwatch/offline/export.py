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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.metric_reads import MetricRef, read_series
from stallwatch.aws.platforms import adapter
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import Store
from stallwatch.core import contract
from stallwatch.core.alarms import host_names
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms import describe, likely
from stallwatch.core.reading import AGENT_STATISTICS, METRIC_PERIOD_SECONDS
from stallwatch.core.signals import JobFacts, JobStatus, Platform, Series
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


class ExportError(ValueError):
    """The job cannot be exported: its platform does not know it."""


def platform_of(job_name: str) -> Platform:
    """The likeliest platform of a job named `job_name` (`core.platforms.likely`): EC2 for an instance id (``i-``
    and 8 to 17 hex digits, as EC2 events spell it), else SageMaker.

    >>> platform_of("i-0123456789abcdef0"), platform_of("llm-7b")
    (<Platform.EC2: 'ec2'>, <Platform.SAGEMAKER: 'sagemaker'>)
    """
    return likely(job_name)[0]


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
        status=JobStatus.RUNNING,
        secondary_status=None,
        start_time=0.0,
        instance_type=job.instance_type,
        instance_count=job.instance_count,
        gpus_per_host=job.gpus_per_host,
        vcpus_per_host=job.vcpus_per_host,
        instance_ids=tuple(job.instance_ids),
        host_types=dict(job.host_types or {}),
        host_instances=dict(job.host_instances or {}),
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
    config: StallwatchConfig | None = None,
    store: Store | None = None,
) -> Trace:
    """Read `job_name` into a trace; write it to `out` if given. The platform is `platform`, else EC2 for an
    instance id and SageMaker for any other name (an EC2 job named by its `stallwatch:job` tag needs `platform`);
    `config`: the deployment's, where its platform reads logs from where the deployment says (EC2's log group);
    `store`: the deployment's table, where its platform's jobs are what their events said (Slurm's).

    The trace spans the job's start (t = 0: a SageMaker job's creation, an EC2 job's first LaunchTime) to its end,
    or to `until` (epoch seconds; default: now while it runs).
    """
    source = adapter(platform or platform_of(job_name), clients, config, store)
    try:
        history = source.history(job_name)
    except JobNotFoundError as exc:
        raise ExportError(str(exc)) from exc
    facts = history.facts
    job = TraceJob(
        name=facts.name,
        platform=facts.platform,
        instance_type=facts.instance_type,
        instance_count=facts.instance_count,
        gpus_per_host=facts.gpus_per_host,
        vcpus_per_host=facts.vcpus_per_host,
        tags=dict(facts.tags),
        instance_ids=list(facts.instance_ids),
        host_types=dict(facts.host_types) or None,
        host_instances=dict(facts.host_instances) or None,
    )
    start, ended = history.start, history.ended
    end = _end_of(start, until, ended)
    events: list[Event] = [
        StatusEvent(t=max(0.0, t - start), status=status, secondary=secondary)
        for t, status, secondary in history.changes
    ]
    events += _metric_events(clients.cloudwatch, job, start, end)
    for selection in history.log_selections:
        events += _log_events(clients.logs, selection, start, end)
    if history.final is not None and (ended is None or ended <= end):
        # Without its end time the job is known ended only by the end of the trace.
        status, secondary = history.final
        events.append(
            StatusEvent(t=max(0.0, (ended if ended is not None else end) - start), status=status, secondary=secondary)
        )
    return _finish(job, events, end - start, f"exported from {source.description.label} ({facts.status})", out)
