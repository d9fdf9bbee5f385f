"""Retrying a resume that failed: which failures a later try can fix, how often and how long to try, and what Slack
is told. Pure: the sweeper (`runtime.resume_retry`) keeps the tries in the table and calls the platform.

    transient("InsufficientInstanceCapacity", 500)        # True: capacity comes back, the next sweep tries again
    next_try_at(last=t, first=t0, tries=2, sweep_s=300)   # when the third try is due, or None: give up

A retry is the same attempt (`<run>-rN`, the same CreateTrainingJob request), never a new one: the restart budget
and the "no progress" rule count attempts, not tries.
"""

from __future__ import annotations

# Transient: a later try can succeed without anyone acting. SageMaker's capacity and rate limits, EC2's capacity and
# request limits, and any server-side error (HTTP 5xx) that outlived botocore's own retries.
TRANSIENT_CODES = frozenset(
    {
        "ResourceLimitExceeded",  # SageMaker: the account's instance quota is in use (other jobs) or capacity is short
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",  # EC2's throttle
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InternalFailure",
        "InternalError",
        "InternalServerError",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
    }
)
CONNECTION_FAILURE = "ConnectionError"  # the code given to a call that got no answer (connect or read timeout)
SERVER_ERROR_STATUS = 500
# A transient failure is retried for an hour after the first failure, once each sweep (a try is due 80 % of a sweep
# interval after the last, as scheduled sweeps drift), and at most 13 times in all (the first and 12 retries: every
# 5-minute sweep of the hour). A duplicated sweep finds the next try not due, or claimed.
RETRY_FOR_SECONDS = 3600
MAX_TRIES = 13
TRY_SPACING_SHARE = 0.8


def transient(code: str, http_status: int | None) -> bool:
    """Whether a failed CreateTrainingJob / StartInstances may succeed if tried again later."""
    return code in TRANSIENT_CODES or code == CONNECTION_FAILURE or (http_status or 0) >= SERVER_ERROR_STATUS


def why_not_retried(code: str) -> str:
    """Why a permanent failure is not retried, for Slack and the audit."""
    if "AccessDenied" in code or code == "UnauthorizedOperation":
        return "not retried: access denied (is the training role tagged `stallwatch:resume`? see docs/resume.md)"
    if code == "ResourceInUse":
        return "not retried: a job of that name exists that this resume did not create"
    if code in ("ValidationException", "InvalidParameterValue", "InvalidParameterCombination"):
        return "not retried: the request was refused as invalid"
    return f"not retried: {code} is not a transient error"


def try_spacing(sweep_s: float) -> float:
    """The least time between two tries: most of a sweep interval."""
    return sweep_s * TRY_SPACING_SHARE


def next_try_at(last: float, first: float, tries: int, sweep_s: float) -> float | None:
    """When the next try is due after `tries` failed ones (the last at `last`, the first at `first`); None when the
    tries or the hour are spent."""
    due = last + try_spacing(sweep_s)
    if tries >= MAX_TRIES or due - first > RETRY_FOR_SECONDS:
        return None
    return due


def retrying_text(job: str, name: str, code: str, sweep_s: float, tries: int = 1) -> str:
    """The first failure's message; with `tries` > 1, as later tries update it in place (bot mode)."""
    every = f"{sweep_s / 60:.0f} min"
    text = (
        f":hourglass_flowing_sand: `{job}`: resume as `{name}` failed: {code}; "
        f"retrying every {every} for up to {_hours(RETRY_FOR_SECONDS)}"
    )
    return text if tries == 1 else f"{text} (try {tries} of {MAX_TRIES} failed)"


def retried_text(resumed: str, tries: int) -> str:
    """The resumed message (`core.resume.resumed_text`) after `tries` tries."""
    return f"{resumed} after {tries} tries"


def gave_up_text(job: str, name: str, tries: int, seconds: float, detail: str) -> str:
    return f":x: `{job}`: resume as `{name}` FAILED after {tries} tries over {seconds / 60:.0f} min; gave up: {detail}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
