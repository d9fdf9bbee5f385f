"""Resuming a stopped job: a new SageMaker training job cloned from the stopped one, or the EC2 group started again.

As with `actions.stop`, API errors are returned, never raised, so the caller can record them and tell Slack.

    described, tags = describe_training_job(clients, "llama-pretrain")
    started = create_training_job(clients, plan.request)   # ResumeResult(ok=True, detail="CreateTrainingJob ...")
    started = start_instances(clients, facts.instance_ids)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError


@dataclass(frozen=True)
class ResumeResult:
    """Whether the new attempt was started, and what the platform said."""

    ok: bool
    detail: str


def describe_training_job(clients: Any, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """DescribeTrainingJob and the job's tags (ListTags, every page)."""
    sagemaker = clients.sagemaker
    described = sagemaker.describe_training_job(TrainingJobName=name)
    tags: dict[str, str] = {}
    request: dict[str, Any] = {"ResourceArn": described["TrainingJobArn"]}
    while True:
        page = sagemaker.list_tags(**request)
        tags |= {t["Key"]: t["Value"] for t in page.get("Tags", [])}
        if not page.get("NextToken"):
            return described, tags
        request["NextToken"] = page["NextToken"]


def create_training_job(clients: Any, request: dict[str, Any]) -> ResumeResult:
    """CreateTrainingJob of the next attempt."""
    name = request["TrainingJobName"]
    try:
        arn = clients.sagemaker.create_training_job(**request)["TrainingJobArn"]
    except ClientError as exc:
        error = exc.response["Error"]  # ResourceInUse: a job of that name exists (the claim makes it not ours)
        return ResumeResult(ok=False, detail=f"CreateTrainingJob {name}: {error['Code']}: {error.get('Message', '')}")
    except BotoCoreError as exc:
        return ResumeResult(ok=False, detail=f"CreateTrainingJob {name}: {type(exc).__name__}: {exc}")
    return ResumeResult(ok=True, detail=f"CreateTrainingJob {arn}")


def start_instances(clients: Any, instance_ids: tuple[str, ...]) -> ResumeResult:
    """StartInstances of the stopped group; the user's launch script resumes training from the checkpoint."""
    if not instance_ids:
        raise ValueError("instance_ids is empty: an EC2 job needs the instances to start")
    try:
        response = clients.ec2.start_instances(InstanceIds=list(instance_ids))
    except ClientError as exc:
        error = exc.response["Error"]
        return ResumeResult(
            ok=False, detail=f"StartInstances {list(instance_ids)}: {error['Code']}: {error.get('Message', '')}"
        )
    except BotoCoreError as exc:
        return ResumeResult(ok=False, detail=f"StartInstances {list(instance_ids)}: {type(exc).__name__}: {exc}")
    states = {i["InstanceId"]: i["CurrentState"]["Name"] for i in response.get("StartingInstances", [])}
    return ResumeResult(ok=True, detail=f"StartInstances: {states}")
