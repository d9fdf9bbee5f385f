"""Stopping a stalled job: a SageMaker training job by its exact name, or EC2 instances.

A job that is already stopping or has ended counts as stopped (the goal is reached); any other failure is
returned, never raised, so the caller can record it, tell Slack and leave the retry to the sweeper.
Transient API errors (throttling, 5xx) are retried by botocore's adaptive mode before that.

    result = stop(clients, facts)   # StopResult(ok=True, detail="StopTrainingJob accepted")
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.clients import AwsClients
from stallwatch.core.signals import JobFacts, Platform

# SageMaker's answer to StopTrainingJob on a job that is not running: "... the training job is in status Stopped."
SAGEMAKER_NOT_RUNNING = re.compile(r"in status (Stopping|Stopped|Completed|Failed)")
EC2_NOT_RUNNING_CODES = frozenset({"IncorrectInstanceState"})


@dataclass(frozen=True)
class StopResult:
    """Whether the job is stopped or stopping now, and what the platform said."""

    ok: bool
    detail: str


def stop(clients: AwsClients, facts: JobFacts) -> StopResult:
    """Stop the job described by `facts`; never raises for API errors."""
    try:
        if facts.platform is Platform.SAGEMAKER:
            return _stop_training_job(clients, facts.name)
        return _stop_instances(clients, facts.instance_ids)
    except BotoCoreError as exc:  # endpoint unreachable, retries exhausted on connection errors
        return StopResult(ok=False, detail=f"{type(exc).__name__}: {exc}")


def _stop_training_job(clients: AwsClients, name: str) -> StopResult:
    try:
        clients.sagemaker.stop_training_job(TrainingJobName=name)
    except ClientError as exc:
        error = exc.response["Error"]
        if error["Code"] == "ValidationException" and SAGEMAKER_NOT_RUNNING.search(error.get("Message", "")):
            return StopResult(ok=True, detail=f"already not running: {error['Message']}")
        return StopResult(ok=False, detail=f"StopTrainingJob {name}: {error['Code']}: {error.get('Message', '')}")
    return StopResult(ok=True, detail=f"StopTrainingJob {name} accepted")


def _stop_instances(clients: AwsClients, instance_ids: tuple[str, ...]) -> StopResult:
    if not instance_ids:
        raise ValueError("facts.instance_ids is empty: an EC2 job needs the instances to stop")
    try:
        response = clients.ec2.stop_instances(InstanceIds=list(instance_ids))
    except ClientError as exc:
        error = exc.response["Error"]
        if error["Code"] in EC2_NOT_RUNNING_CODES:
            return StopResult(ok=True, detail=f"already not running: {error.get('Message', '')}")
        return StopResult(
            ok=False, detail=f"StopInstances {list(instance_ids)}: {error['Code']}: {error.get('Message', '')}"
        )
    states = {i["InstanceId"]: i["CurrentState"]["Name"] for i in response.get("StoppingInstances", [])}
    return StopResult(ok=True, detail=f"StopInstances: {states}")
