"""A resume's platform call as a result: API errors are returned, never raised, so the caller can record them, tell
Slack, and retry the transient ones (`core.resume_retry`). Each platform's adapter starts its own next attempt
(`aws.platforms`: CreateTrainingJob, StartInstances).

    started = adapter(platform, clients).start_attempt(plan)   # ResumeResult(ok=True, detail="CreateTrainingJob ...")
    return failure(f"StartInstances {ids}", exc)               # in an adapter: ResumeResult(ok=False, code=..., ...)
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from stallwatch.aws.api_errors import api_error
from stallwatch.core import resume_retry
from stallwatch.core.platforms.interface import ResumeResult


def failure(call: str, exc: ClientError | BotoCoreError) -> ResumeResult:
    """A failed call as a result: its code, and whether it is transient (a connection or read timeout is)."""
    error = api_error(exc)
    code = error.code
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):  # no answer at all: a later try may get one
        code = resume_retry.CONNECTION_FAILURE
    detail = f"{call}: {error}"
    return ResumeResult(ok=False, detail=detail, code=code, transient=resume_retry.transient(code, error.status))
