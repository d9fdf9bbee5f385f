"""The scheduled safety net: log idleness, missing alarms, expired snoozes and pending stops of running jobs."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.events import ScheduledEvent, parse_event
from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import environment, sweep


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    parse_event(event, ScheduledEvent)
    return sweep.sweep(environment.runtime())
