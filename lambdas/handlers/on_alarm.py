"""The per-job alarms' action: decide on the alarm's job and act (stop, alert, audit).

Invoked directly as a CloudWatch Lambda alarm action, or by the EventBridge "CloudWatch Alarm State Change"; and by
`stallwatch doctor --send-test-alert` (a test message, nothing stopped).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.events import TEST_ALERT_KEY, AlarmEvent, TestAlertEvent, parse_event
from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import decide, environment, test_alert


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if isinstance(event, dict) and TEST_ALERT_KEY in event:
        return test_alert.send_test_alert(environment.runtime(), parse_event(event, TestAlertEvent).request)
    return decide.handle_alarm(parse_event(event, AlarmEvent), environment.runtime())
