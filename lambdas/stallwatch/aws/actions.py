"""Stopping a stalled job: a SageMaker training job by its exact name, or EC2 instances.

A job that is already stopping or has ended counts as stopped (the goal is reached); any other failure is
returned, never raised, so the caller can record it, tell Slack and leave the retry to the sweeper.
Transient API errors (throttling, 5xx) are retried by botocore's adaptive mode before that.

    result = stop(clients, facts)   # StopResult(ok=True, detail="StopTrainingJob accepted")
    result = stop(clients, ec2_facts)   # one StopInstances for all instances: result.count "4 of 4 instances stopping"
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.api_errors import api_error
from stallwatch.aws.clients import AwsClients
from stallwatch.core.signals import JobFacts, Platform

# SageMaker's answer to StopTrainingJob on a job that is not running: "... the training job is in status Stopped."
SAGEMAKER_NOT_RUNNING = re.compile(r"in status (Stopping|Stopped|Completed|Failed)")
EC2_NOT_RUNNING_CODES = frozenset({"IncorrectInstanceState"})


@dataclass(frozen=True)
class StopResult:
    """Whether the job is stopped or stopping now, and what the platform said; on EC2, how many of its
    instances are (`stopped` of `targets`)."""

    ok: bool
    detail: str
    stopped: int | None = None
    targets: int | None = None

    @property
    def count(self) -> str:
        """ "3 of 4 instances stopping", or "" where the platform stops one job."""
        return "" if self.targets is None else f"{self.stopped} of {self.targets} instances stopping"


def stop(clients: AwsClients, facts: JobFacts) -> StopResult:
    """Stop the job described by `facts`; never raises for API errors."""
    try:
        if facts.platform is Platform.SAGEMAKER:
            return _stop_training_job(clients, facts.name)
        return _stop_instances(clients, facts.instance_ids)
    except BotoCoreError as exc:  # endpoint unreachable, retries exhausted on connection errors
        return StopResult(ok=False, detail=str(api_error(exc)))


def _stop_training_job(clients: AwsClients, name: str) -> StopResult:
    try:
        clients.sagemaker.stop_training_job(TrainingJobName=name)
    except ClientError as exc:
        error = api_error(exc)
        if error.code == "ValidationException" and SAGEMAKER_NOT_RUNNING.search(error.message):
            return StopResult(ok=True, detail=f"already not running: {error.message}")
        return StopResult(ok=False, detail=f"StopTrainingJob {name}: {error}")
    return StopResult(ok=True, detail=f"StopTrainingJob {name} accepted")


def _stop_instances(clients: AwsClients, instance_ids: tuple[str, ...]) -> StopResult:
    """One StopInstances for all of the job's instances. If it is refused (one instance not tagged for stopping, or
    in a state that cannot stop, refuses the whole call), each instance is stopped on its own, so the others stop
    and the refusals are named; the result is ok only when every instance is stopping."""
    if not instance_ids:
        return StopResult(ok=True, detail="no instance left to stop", stopped=0, targets=0)
    error = _stop_call(clients, list(instance_ids))
    refused: dict[str, str] = {}
    if error is not None and len(instance_ids) == 1:
        refused = {} if error[0] in EC2_NOT_RUNNING_CODES else {instance_ids[0]: f"{error[0]}: {error[1]}"}
    elif error is not None:
        for instance_id in instance_ids:
            own = _stop_call(clients, [instance_id])
            if own is not None and own[0] not in EC2_NOT_RUNNING_CODES:
                refused[instance_id] = f"{own[0]}: {own[1]}"
    stopped = len(instance_ids) - len(refused)
    detail = f"StopInstances: {stopped} of {len(instance_ids)} instances stopping"
    if refused:
        detail += "; refused: " + "; ".join(f"{i}: {why}" for i, why in sorted(refused.items()))
    return StopResult(ok=not refused, detail=detail, stopped=stopped, targets=len(instance_ids))


def _stop_call(clients: AwsClients, instance_ids: list[str]) -> tuple[str, str] | None:
    """StopInstances for `instance_ids`: None when accepted, else the error's code and message (already stopping
    or stopped instances are accepted; one that is neither yet cannot stop answers IncorrectInstanceState)."""
    try:
        clients.ec2.stop_instances(InstanceIds=instance_ids)
    except ClientError as exc:
        error = api_error(exc)
        return error.code, error.message
    return None
