"""The CloudWatch Logs subscription's destination: a fatal line in a training log group wakes a decision on its job.

The subscription filter (`log_patterns.FATAL_FILTER_PATTERN`) on SageMaker's and the EC2 jobs' log groups sends
fatal lines only; CloudWatch Logs invokes this function asynchronously with ``{"awslogs": {"data": ...}}``.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.events import LogLinesEvent, parse_event
from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import environment, wake


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    parsed = parse_event(event, LogLinesEvent)
    return wake.handle_log_lines(parsed, environment.runtime(), wake.time_left(context))
