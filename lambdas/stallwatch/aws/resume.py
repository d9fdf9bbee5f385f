"""Resuming a stopped job: a new SageMaker training job cloned from the stopped one, or the EC2 group started again.

As with `actions.stop`, API errors are returned, never raised, so the caller can record them, tell Slack, and retry
the transient ones (`core.resume_retry`).

    described, tags = describe_training_job(clients, "llama-pretrain")
    started = create_training_job(clients, plan.request)   # ResumeResult(ok=True, detail="CreateTrainingJob ...")
    started = start_instances(clients, facts.instance_ids)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from stallwatch.aws.api_errors import api_error
from stallwatch.core import resume_retry
from stallwatch.core.resume import ATTEMPT_TAG, RESUMED_FROM_TAG

NAME_IN_USE = "ResourceInUse"
ALREADY_EXISTS = "already exists"  # SageMaker's message for a name in use


@dataclass(frozen=True)
class ResumeResult:
    """Whether the new attempt was started, what the platform said, and whether a later try may succeed."""

    ok: bool
    detail: str
    code: str = ""  # the error code ("" when started)
    transient: bool = False


def describe_training_job(clients: Any, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """DescribeTrainingJob and the job's tags (ListTags, every page)."""
    sagemaker = clients.sagemaker
    described = sagemaker.describe_training_job(TrainingJobName=name)
    pages = sagemaker.get_paginator("list_tags").paginate(ResourceArn=described["TrainingJobArn"])
    return described, {t["Key"]: t["Value"] for page in pages for t in page.get("Tags", [])}


def create_training_job(clients: Any, request: dict[str, Any]) -> ResumeResult:
    """CreateTrainingJob of the next attempt. A job of that name that carries this attempt's chain tags was created
    by an earlier call whose answer was lost (a timeout, a 5xx after SageMaker took it): started, not failed."""
    name = request["TrainingJobName"]
    try:
        arn = clients.sagemaker.create_training_job(**request)["TrainingJobArn"]
    except (ClientError, BotoCoreError) as exc:
        failed = _failure(f"CreateTrainingJob {name}", exc)
        if (failed.code == NAME_IN_USE or ALREADY_EXISTS in failed.detail) and _created_by(clients, request):
            return ResumeResult(ok=True, detail=f"CreateTrainingJob {name}: created by an earlier try ({failed.code})")
        return failed
    return ResumeResult(ok=True, detail=f"CreateTrainingJob {arn}")


def _created_by(clients: Any, request: dict[str, Any]) -> bool:
    """Whether the existing job named in `request` is the one `request` creates (the same chain tags)."""
    wanted = {t["Key"]: t["Value"] for t in request.get("Tags", []) if t["Key"] in (RESUMED_FROM_TAG, ATTEMPT_TAG)}
    try:
        _, tags = describe_training_job(clients, request["TrainingJobName"])
    except (ClientError, BotoCoreError):
        return False
    return len(wanted) == 2 and all(tags.get(k) == v for k, v in wanted.items())


def start_instances(clients: Any, instance_ids: tuple[str, ...]) -> ResumeResult:
    """StartInstances of the stopped group; the user's launch script resumes training from the checkpoint."""
    if not instance_ids:
        raise ValueError("instance_ids is empty: an EC2 job needs the instances to start")
    try:
        response = clients.ec2.start_instances(InstanceIds=list(instance_ids))
    except (ClientError, BotoCoreError) as exc:
        return _failure(f"StartInstances {list(instance_ids)}", exc)
    states = {i["InstanceId"]: i["CurrentState"]["Name"] for i in response.get("StartingInstances", [])}
    return ResumeResult(ok=True, detail=f"StartInstances: {states}")


def _failure(call: str, exc: ClientError | BotoCoreError) -> ResumeResult:
    """A failed call as a result: its code, and whether it is transient (a connection or read timeout is)."""
    error = api_error(exc)
    code = error.code
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):  # no answer at all: a later try may get one
        code = resume_retry.CONNECTION_FAILURE
    detail = f"{call}: {error}"
    return ResumeResult(ok=False, detail=detail, code=code, transient=resume_retry.transient(code, error.status))
