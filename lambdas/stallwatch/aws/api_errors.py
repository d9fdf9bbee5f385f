"""One way to say what AWS refused, for every adapter that returns API errors rather than raising them.

    error = api_error(exc)                   # ApiError(code="AccessDeniedException", message="User: ...", status=400)
    detail = f"StopTrainingJob {name}: {error}"          # "StopTrainingJob j: AccessDeniedException: User: ..."

A ClientError gives its error code, message and HTTP status (an answer without them reads ``Unknown`` and ""); a
BotoCoreError, which has no answer (no endpoint, a timeout, retries spent), its type and text.
"""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

UNKNOWN_CODE = "Unknown"


@dataclass(frozen=True)
class ApiError:
    """A refused or unanswered AWS call: ``code: message`` as text."""

    code: str
    message: str
    status: int | None = None  # the HTTP status of AWS's answer; None without one

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def api_error(exc: ClientError | BotoCoreError) -> ApiError:
    """What `exc` says AWS answered (or why nothing answered)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return ApiError(str(error.get("Code") or UNKNOWN_CODE), str(error.get("Message", "")), status)
    return ApiError(type(exc).__name__, str(exc))
