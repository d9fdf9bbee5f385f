"""A resume's platform call as a result: API errors are returned, never raised, so the caller can record them, tell
Slack, and retry the transient ones (`core.resume_retry`). Each platform's adapter starts its own next attempt
(`aws.platforms`: CreateTrainingJob, StartInstances).

    started = adapter(platform, clients).start_attempt(plan)   # ResumeResult(ok=True, detail="CreateTrainingJob ...")
    return failure(f"StartInstances {ids}", exc)               # in an adapter: ResumeResult(ok=False, code=..., ...)
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from stallwatch.core import resume_retry
from stallwatch.core.platforms.interface import ResumeResult


def failure(call: str, exc: ClientError | BotoCoreError) -> ResumeResult:
    """A failed call as a result: its code, and whether it is transient (a connection or read timeout is)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "Unknown"))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = f"{call}: {code}: {error.get('Message', '')}"
        return ResumeResult(ok=False, detail=detail, code=code, transient=resume_retry.transient(code, status))
    no_answer = isinstance(exc, (BotoConnectionError, HTTPClientError))
    code = resume_retry.CONNECTION_FAILURE if no_answer else type(exc).__name__
    detail = f"{call}: {type(exc).__name__}: {exc}"
    return ResumeResult(ok=False, detail=detail, code=code, transient=resume_retry.transient(code, None))
