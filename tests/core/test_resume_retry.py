"""Which resume failures are retried, on what schedule, and what Slack is told (pure)."""

from __future__ import annotations

import pytest

from stallwatch.core import resume_retry
from stallwatch.core.resume_retry import MAX_TRIES, RETRY_FOR_SECONDS, next_try_at, transient, why_not_retried

SWEEP_S = 300


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ResourceLimitExceeded", 400),
        ("ThrottlingException", 400),
        ("InsufficientInstanceCapacity", 500),
        ("RequestLimitExceeded", 503),
        ("Unavailable", 503),
        ("InternalError", 500),
        ("SomethingNew", 502),  # any 5xx
        (resume_retry.CONNECTION_FAILURE, None),  # no answer: a connect or read timeout
    ],
)
def test_capacity_throttles_and_server_errors_are_transient(code: str, status: int | None) -> None:
    assert transient(code, status)


@pytest.mark.parametrize(
    "code", ["AccessDeniedException", "ValidationException", "ResourceInUse", "UnauthorizedOperation", "ParamError"]
)
def test_refusals_a_retry_cannot_fix_are_permanent_and_say_why(code: str) -> None:
    assert not transient(code, 400)
    assert why_not_retried(code).startswith("not retried: ")
    assert "stallwatch:resume" in why_not_retried("AccessDeniedException")


def test_a_try_is_due_each_sweep_until_the_hour_or_the_tries_are_spent() -> None:
    first = 1_000.0
    tries, last, schedule = 1, first, []
    while (due := next_try_at(last, first, tries, SWEEP_S)) is not None:
        schedule.append(due - last)
        last, tries = last + SWEEP_S, tries + 1  # the sweep after the due time takes it
    assert tries == MAX_TRIES
    assert set(schedule) == {0.8 * SWEEP_S}
    assert last - first <= RETRY_FOR_SECONDS
    # a slower sweep spends the hour before the tries
    assert next_try_at(first + 3_000, first, 3, 900) is None


def test_slack_texts_name_the_schedule_and_the_tries() -> None:
    assert resume_retry.retrying_text("llama", "llama-r1", "ResourceLimitExceeded", SWEEP_S).endswith(
        "`llama`: resume as `llama-r1` failed: ResourceLimitExceeded; retrying every 5 min for up to 1 h"
    )
    assert resume_retry.retried_text("resumed as `llama-r1` (attempt 2 of 3)", 3).endswith(
        "(attempt 2 of 3) after 3 tries"
    )
    assert "FAILED after 13 tries over 60 min; gave up: boom" in resume_retry.gave_up_text(
        "llama", "llama-r1", 13, 3600, "boom"
    )
