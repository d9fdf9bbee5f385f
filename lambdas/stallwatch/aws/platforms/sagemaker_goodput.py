"""A SageMaker run's history, for `core.goodput`: its jobs (the first one and its resumes), their agent windows
(CloudWatch) and Stallwatch's stops (the audit trail).

    run, spans = sagemaker_run_spans(clients, store, "llama-8b-r1", now=time.time(), period=60)   # [JobSpan, ...]
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.agent_windows import windows
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core.goodput import JobSpan
from stallwatch.core.platforms.interface import AuditTrail
from stallwatch.core.platforms.sagemaker import sagemaker_layout
from stallwatch.core.policy import MAX_RESTARTS_LIMIT
from stallwatch.core.resume import RUN_TAG, StopRecord, resume_name, run_name
from stallwatch.core.signals import Platform

NOT_FOUND_CODES = ("ValidationException", "ResourceNotFound")


def describe_training_job(clients: Any, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """DescribeTrainingJob and the job's tags (ListTags, every page)."""
    sagemaker = clients.sagemaker
    described = sagemaker.describe_training_job(TrainingJobName=name)
    pages = sagemaker.get_paginator("list_tags").paginate(ResourceArn=described["TrainingJobArn"])
    return described, {t["Key"]: t["Value"] for page in pages for t in page.get("Tags", [])}


def sagemaker_run_spans(
    clients: Any, store: AuditTrail | None, job: str, now: float, period: int
) -> tuple[str, list[JobSpan]]:
    """The run `job` belongs to, as `JobSpan`s: windows read at `period` seconds, stops from `store` (if given)."""
    run, jobs = run_jobs(clients, job)
    return run, [_span(clients, store, described, now, period) for described, _ in jobs]


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


def _span(clients: Any, store: AuditTrail | None, described: dict[str, Any], now: float, period: int) -> JobSpan:
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


def _stop(store: AuditTrail | None, name: str) -> StopRecord | None:
    """Stallwatch's last stop of the job that went through."""
    stops = [s for s in store.stops(job_key(Platform.SAGEMAKER, name)) if s.ok is not False] if store else []
    return stops[-1] if stops else None
