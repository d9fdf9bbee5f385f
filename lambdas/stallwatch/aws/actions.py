"""Stopping a stalled job, whatever its platform: the platform's adapter stops it (`aws.platforms`), a SageMaker
training job by its exact name, an EC2 job's instances with one StopInstances.

A job that is already stopping or has ended counts as stopped (the goal is reached); any other failure is
returned, never raised, so the caller can record it, tell Slack and leave the retry to the sweeper.
Transient API errors (throttling, 5xx) are retried by botocore's adaptive mode before that.

    result = stop(rt.source(facts.platform), facts)   # StopResult(ok=True, detail="StopTrainingJob accepted")
    result = stop(rt.source(ec2.platform), ec2)   # one StopInstances for all instances: "4 of 4 instances stopping"
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError

from stallwatch.aws.api_errors import api_error
from stallwatch.core.platforms.interface import PlatformAdapter, StopResult
from stallwatch.core.signals import JobFacts


def stop(source: PlatformAdapter, facts: JobFacts) -> StopResult:
    """Stop the job described by `facts` through its platform's adapter `source`; never raises for API errors."""
    try:
        return source.stop(facts)
    except BotoCoreError as exc:  # endpoint unreachable, retries exhausted on connection errors
        return StopResult(ok=False, detail=str(api_error(exc)))
