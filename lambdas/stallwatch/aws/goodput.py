"""A run's history from AWS, for `core.goodput`: its jobs (the first one and its resumes), their agent windows
(CloudWatch) and Stallwatch's stops (the audit trail). An EC2 job's run is read by `ec2_goodput`.

    spans = run_spans(clients, store, "llama-8b-r1", now=time.time())   # (run name, [JobSpan, ...])
    goodput = measure_goodput(*spans)
    run_spans(clients, store, "llm-70b", now)   # no platform given: SageMaker, else EC2 (an instance id: EC2 first)
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.agent_windows import windows
from stallwatch.aws.ec2_goodput import ec2_run_spans
from stallwatch.aws.resume import describe_training_job
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import Store, job_key
from stallwatch.core.clusters import INSTANCE_ID, sagemaker_layout
from stallwatch.core.goodput import JobSpan
from stallwatch.core.policy import MAX_RESTARTS_LIMIT
from stallwatch.core.reading import METRIC_PERIOD_SECONDS
from stallwatch.core.resume import RUN_TAG, StopRecord, resume_name, run_name
from stallwatch.core.signals import Platform

NOT_FOUND_CODES = ("ValidationException", "ResourceNotFound")


def run_jobs(clients: Any, job: str) -> tuple[str, list[tuple[dict[str, Any], dict[str, str]]]]:
    """The run `job` belongs to, and its jobs in order (DescribeTrainingJob and tags of each): the first job, then
    `<run>-r1`, `<run>-r2`, ... while they exist and are this run's (tagged `stallwatch:run=<run>`): a job of that
    name that another run or a person created ends the chain."""
    described = _describe(clients, job)
    run = run_name(job, described[1])
    jobs = [described if run == job else _describe(clients, run)]
    for attempt in range(1, MAX_RESTARTS_LIMIT + 1):
        try:
            resumed = _describe(clients, resume_name(run, attempt))
        except JobNotFoundError:
            break
        if resumed[1].get(RUN_TAG) != run:
            break
        jobs.append(resumed)
    return run, jobs


def _describe(clients: Any, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        return describe_training_job(clients, name)
    except clients.sagemaker.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in NOT_FOUND_CODES:
            raise JobNotFoundError(f"training job {name!r}: {exc.response['Error']['Message']}") from exc
        raise


def run_spans(
    clients: Any,
    store: Store | None,
    job: str,
    now: float,
    period: int = METRIC_PERIOD_SECONDS,
    platform: Platform | None = None,
) -> tuple[str, list[JobSpan]]:
    """The run `job` belongs to, as `JobSpan`s: windows read at `period` seconds, stops from `store` (if given).
    `platform` None: a SageMaker training job, else an EC2 job of that name (an instance id is looked up on EC2
    first); `JobNotFoundError` names both when neither has it."""
    if platform is not None:
        return _platform_spans(clients, store, job, now, period, platform)
    order = [Platform.EC2, Platform.SAGEMAKER] if INSTANCE_ID.match(job) else [Platform.SAGEMAKER, Platform.EC2]
    missing = []
    for candidate in order:
        try:
            return _platform_spans(clients, store, job, now, period, candidate)
        except JobNotFoundError as exc:
            missing.append(f"{candidate.value}: {exc}")
    raise JobNotFoundError(f"{job!r} is neither a SageMaker training job nor an EC2 job ({'; '.join(missing)})")


def _platform_spans(
    clients: Any, store: Store | None, job: str, now: float, period: int, platform: Platform
) -> tuple[str, list[JobSpan]]:
    if platform is Platform.EC2:
        return ec2_run_spans(clients, store, job, now, period)
    run, jobs = run_jobs(clients, job)
    return run, [_span(clients, store, described, now, period) for described, _ in jobs]


def _span(clients: Any, store: Store | None, described: dict[str, Any], now: float, period: int) -> JobSpan:
    name = described["TrainingJobName"]
    created = described["CreationTime"].timestamp()
    end = described.get("TrainingEndTime")
    ended = end.timestamp() if end else now if described["TrainingJobStatus"] == "InProgress" else created
    training = [t["StartTime"] for t in described.get("SecondaryStatusTransitions", []) if t["Status"] == "Training"]
    layout = sagemaker_layout(described["ResourceConfig"])
    stop = _stop(store, name)
    return JobSpan(
        name=name,
        instance_type=layout.instance_type,
        hosts=layout.instance_count,
        created=created,
        ended=max(ended, created),
        windows=windows(clients, name, created, ended, period),
        stall=(stop.stall_onset, stop.at) if stop is not None else None,
        stall_why=stop.why if stop is not None else None,
        training_started=training[0].timestamp() if training else None,
        fleet=layout.mixed_fleet(),
    )


def _stop(store: Store | None, name: str) -> StopRecord | None:
    """Stallwatch's last stop of the job that went through."""
    stops = [s for s in store.stops(job_key(Platform.SAGEMAKER, name)) if s.ok is not False] if store else []
    return stops[-1] if stops else None
