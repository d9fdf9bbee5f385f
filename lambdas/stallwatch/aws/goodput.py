"""A run's history from AWS, for `core.goodput`: its jobs (the first one and its resumes), their agent windows
(CloudWatch) and Stallwatch's stops (the audit trail).

    spans = run_spans(clients, store, "llama-8b-r1", now=time.time())   # (run name, [JobSpan, ...])
    goodput = measure_goodput(*spans)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from stallwatch.aws.metric_reads import MetricRef, read_series
from stallwatch.aws.resume import describe_training_job
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import Store, job_key
from stallwatch.core import contract
from stallwatch.core.goodput import JobSpan, Window
from stallwatch.core.policy import MAX_RESTARTS_LIMIT
from stallwatch.core.reading import METRIC_PERIOD_SECONDS
from stallwatch.core.resume import resume_name, run_name
from stallwatch.core.signals import Platform

# What each window needs, and the statistic a period of several agent windows is read with.
WINDOW_METRICS = {
    "Steps": "Sum",
    "Step": "Maximum",
    "PhaseBudgetRemaining": "Maximum",
    "TFLOPsPerGPU": "Average",
    "MFU": "Average",
}
NOT_FOUND_CODES = ("ValidationException", "ResourceNotFound")


def run_jobs(clients: Any, job: str) -> tuple[str, list[tuple[dict[str, Any], dict[str, str]]]]:
    """The run `job` belongs to, and its jobs in order (DescribeTrainingJob and tags of each): the first job, then
    `<run>-r1`, `<run>-r2`, ... while they exist."""
    described = _describe(clients, job)
    run = run_name(job, described[1])
    jobs = [described if run == job else _describe(clients, run)]
    for attempt in range(1, MAX_RESTARTS_LIMIT + 1):
        try:
            jobs.append(_describe(clients, resume_name(run, attempt)))
        except JobNotFoundError:
            break
    return run, jobs


def _describe(clients: Any, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        return describe_training_job(clients, name)
    except clients.sagemaker.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in NOT_FOUND_CODES:
            raise JobNotFoundError(f"training job {name!r}: {exc.response['Error']['Message']}") from exc
        raise


def run_spans(
    clients: Any, store: Store | None, job: str, now: float, period: int = METRIC_PERIOD_SECONDS
) -> tuple[str, list[JobSpan]]:
    """The run `job` belongs to, as `JobSpan`s: windows read at `period` seconds, stops from `store` (if given)."""
    run, jobs = run_jobs(clients, job)
    return run, [_span(clients, store, described, now, period) for described, _ in jobs]


def _span(clients: Any, store: Store | None, described: dict[str, Any], now: float, period: int) -> JobSpan:
    name = described["TrainingJobName"]
    created = described["CreationTime"].timestamp()
    end = described.get("TrainingEndTime")
    ended = end.timestamp() if end else now if described["TrainingJobStatus"] == "InProgress" else created
    training = [t["StartTime"] for t in described.get("SecondaryStatusTransitions", []) if t["Status"] == "Training"]
    resources = described["ResourceConfig"]
    return JobSpan(
        name=name,
        instance_type=resources["InstanceType"],
        hosts=resources["InstanceCount"],
        created=created,
        ended=max(ended, created),
        windows=windows(clients, name, created, ended, period),
        stall=_stall(store, name) if store is not None else None,
        training_started=training[0].timestamp() if training else None,
    )


def windows(clients: Any, job: str, start: float, end: float, period: int) -> tuple[Window, ...]:
    """The agent's job metrics over [start, end), one `Window` per period that has a Steps datapoint."""
    dims = ((contract.DIM_JOB, job),)
    refs = {name: MetricRef(contract.NAMESPACE, name, dims, statistic) for name, statistic in WINDOW_METRICS.items()}
    series = read_series(clients.cloudwatch, list(refs.values()), start - period, end + period, period)
    by_time: dict[float, dict[str, float]] = defaultdict(dict)
    for name, ref in refs.items():
        for t, value in series[ref].points:
            by_time[t][name] = value
    return tuple(
        Window(
            start=t,
            end=t + period,
            steps=values["Steps"],
            step=values.get("Step"),
            in_phase=values.get("PhaseBudgetRemaining", 0.0) > 0,
            tflops_per_gpu=values.get("TFLOPsPerGPU"),
            mfu=values.get("MFU"),
        )
        for t, values in sorted(by_time.items())
        if "Steps" in values
    )


def _stall(store: Store, name: str) -> tuple[float, float] | None:
    """Stallwatch's last stop of the job that went through: (the stall's onset, the stop)."""
    stops = [s for s in store.stops(job_key(Platform.SAGEMAKER, name)) if s.ok is not False]
    return (stops[-1].stall_onset, stops[-1].at) if stops else None
