"""AWS Health's EC2 scheduled events: tell the jobs on the instances they name, and plan their moves off them."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.events import parse_event
from stallwatch.aws.health_events import HealthEvent
from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import environment, health


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return health.on_health_event(parse_event(event, HealthEvent), environment.runtime())
