"""The per-job alarms' action: decide on the alarm's job and act (stop, alert, audit).

Invoked directly as a CloudWatch Lambda alarm action, or by the EventBridge "CloudWatch Alarm State Change".
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.events import AlarmEvent, parse_event
from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import decide, environment


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return decide.handle_alarm(parse_event(event, AlarmEvent), environment.runtime())
