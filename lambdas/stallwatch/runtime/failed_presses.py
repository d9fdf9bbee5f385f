"""Slack presses Lambda gave up applying: each one posted back to its channel and counted, never dropped silently.

The Slack endpoint applies a press in an asynchronous invocation of itself (`interactions`). One that still fails
after Lambda's two retries, or waits longer than `PRESS_MAX_AGE_SECONDS` (the function throttled), goes to the
function's on-failure destination: an SQS queue the same function reads. Each message is Lambda's invocation record:

    {"version": "1.0", "timestamp": "2026-11-30T10:04:07.123Z",
     "requestContext": {"requestId": "...", "functionArn": "...:function:...:$LATEST",
                        "condition": "RetriesExhausted", "approximateInvokeCount": 3},
     "requestPayload": {"stallwatch_deferred_press": {"body": "payload=...", "timestamp": "...", "signature": "..."}},
     "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
     "responsePayload": {"errorMessage": "...", "errorType": "ClientError"}}

`report` hands each press to `Interactions.report_failed`; a record it cannot post back is returned as a batch item
failure, so SQS delivers it again (and, after the queue's receive count, moves it to the dead-letter queue, which
alarms).

    return failed_presses.report(event, context)     # the handler, for an SQS event
"""

from __future__ import annotations

from typing import Any, Literal

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from pydantic import BaseModel, ConfigDict, Field

from stallwatch.aws.observability import logger
from stallwatch.core.config import PRESS_MAX_AGE_SECONDS
from stallwatch.runtime import interactions
from stallwatch.runtime.interactions import DEFERRED_EVENT_KEY, DeferredPress, Reply

RETRIES_EXHAUSTED = "RetriesExhausted"
EVENT_AGE_EXCEEDED = "EventAgeExceeded"
ERROR_TYPE_MAX = 64  # the error's type goes to Slack; never its message (it may name resources, or quote a secret)


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class RequestContext(_Record):
    condition: str = Field(max_length=64)
    approximate_invoke_count: int = Field(0, alias="approximateInvokeCount")
    request_id: str = Field("", alias="requestId", max_length=128)


class InvocationRecord(_Record):
    """Lambda's record of an asynchronous invocation that failed (the on-failure destination's message)."""

    version: Literal["1.0"] = "1.0"
    request_context: RequestContext = Field(alias="requestContext")
    request_payload: dict[str, DeferredPress] = Field(alias="requestPayload")
    response_payload: dict[str, Any] | None = Field(None, alias="responsePayload")

    @property
    def press(self) -> DeferredPress:
        return self.request_payload[DEFERRED_EVENT_KEY]

    def reason(self) -> str:
        """Why the press was not applied, in words for the channel."""
        context = self.request_context
        if context.condition == EVENT_AGE_EXCEEDED:
            return f"it waited more than {PRESS_MAX_AGE_SECONDS // 60} minutes for the endpoint (throttled)"
        error = str((self.response_payload or {}).get("errorType", "an error"))[:ERROR_TYPE_MAX]
        if context.condition == RETRIES_EXHAUSTED:
            return f"it failed {context.approximate_invoke_count or 3} times ({error})"
        return f"Lambda gave up on it ({context.condition}: {error})"


def report(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Post back every failed press of an SQS event; the ones not posted are its batch item failures."""
    # Every record failed is still a partial answer, not an error: the function's Errors alarm stays for bugs.
    processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    return process_partial_response(event=event, record_handler=_report_one, processor=processor, context=context)


def _report_one(record: SQSRecord) -> dict[str, Any]:
    failed = InvocationRecord.model_validate_json(record.body)
    # The error's message stays out of the logs too: an exception's text may quote a secret (a webhook URL).
    error = (failed.response_payload or {}).get("errorType")
    logger.info(
        "a press Lambda gave up applying",
        extra={
            "request": failed.request_context.request_id,
            "condition": failed.request_context.condition,
            "error": error,
        },
    )
    reply: Reply = interactions.endpoint().report_failed(failed.press, failed.reason())
    return reply.body
