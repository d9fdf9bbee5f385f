"""Stopping a stalled job, whatever its platform: the platform's adapter stops it (`aws.platforms`), a SageMaker
training job by its exact name, an EC2 job's instances with one StopInstances.

A job that is already stopping or has ended counts as stopped (the goal is reached); any other failure is
returned, never raised, so the caller can record it, tell Slack and leave the retry to the sweeper.
Transient API errors (throttling, 5xx) are retried by botocore's adaptive mode before that.

    result = stop(clients, facts)   # StopResult(ok=True, detail="StopTrainingJob accepted")
    result = stop(clients, ec2_facts)   # one StopInstances for all instances: result.count "4 of 4 instances stopping"
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError

from stallwatch.aws.api_errors import api_error
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.platforms import adapter
from stallwatch.core.platforms.interface import StopResult
from stallwatch.core.signals import JobFacts


def stop(clients: AwsClients, facts: JobFacts, at_fault: tuple[str, ...] | None = None) -> StopResult:
    """Stop the job described by `facts` (`at_fault`: the engine's stop decision's hosts at fault, which a platform
    that requeues may keep the job off; None: a plain stop); never raises for API errors."""
    try:
        return adapter(facts.platform, clients).stop(facts, at_fault)
    except BotoCoreError as exc:  # endpoint unreachable, retries exhausted on connection errors
        return StopResult(ok=False, detail=str(api_error(exc)))
