"""The per-job alarms' action: decide on the alarm's job and act (stop, alert, audit).

Invoked directly as a CloudWatch Lambda alarm action, or by the EventBridge "CloudWatch Alarm State Change".
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch import watchdog
from stallwatch.events import AlarmEvent, parse_event
from stallwatch.observability import logger, metrics, tracer


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return watchdog.handle_alarm(parse_event(event, AlarmEvent), watchdog.runtime())
