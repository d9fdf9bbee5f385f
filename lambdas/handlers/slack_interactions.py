"""The Slack interactivity endpoint (a Lambda Function URL): verify the signature, answer, then apply the press.

The Function URL has no IAM auth (Slack cannot sign SigV4); the Slack signature is the authentication. The work
runs in this function's own asynchronous invocation (event `{"stallwatch_deferred_press": ...}`), after Slack got
its answer; one Lambda gave up on reaches this function again from its on-failure queue (an SQS event), and is
posted back to the channel.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import LambdaFunctionUrlModel
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import failed_presses, interactions


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if isinstance(event, dict) and interactions.DEFERRED_EVENT_KEY in event:
        press = interactions.DeferredPress.model_validate(event[interactions.DEFERRED_EVENT_KEY])
        return interactions.endpoint().complete(press).body
    if isinstance(event, dict) and "Records" in event:  # the on-failure queue: presses Lambda gave up applying
        return failed_presses.report(event, context)
    try:
        request = parse(event=event, model=LambdaFunctionUrlModel)
        raw = request.body or ""
        body = base64.b64decode(raw, validate=True) if request.isBase64Encoded else raw
    except (ValidationError, binascii.Error) as exc:
        logger.warning("not a Function URL request", extra={"error": str(exc)[:200]})
        reply = interactions.Reply(
            400, {"status": "rejected", "error": f"not a Function URL request: {type(exc).__name__}"}
        )
    else:
        reply = interactions.endpoint().handle(body, request.headers, request.requestContext.http.method)
    return {"statusCode": reply.status, "headers": {"Content-Type": "application/json"}, "body": json.dumps(reply.body)}
