"""The per-job alarms' action, and the rechecks' target: decide on the job and act (stop, alert, audit).

Invoked directly as a CloudWatch Lambda alarm action, by the EventBridge "CloudWatch Alarm State Change", or by a
job's one-time EventBridge Scheduler schedule when the engine asked to decide again then (`RecheckEvent`); and by
`stallwatch doctor --send-test-alert` (a test message, nothing stopped).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.events import TEST_ALERT_KEY, OnAlarmEvent, RecheckEvent, TestAlertEvent, parse_event
from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import decide, environment, test_alert


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if isinstance(event, dict) and TEST_ALERT_KEY in event:
        return test_alert.send_test_alert(environment.runtime(), parse_event(event, TestAlertEvent).request)
    parsed = parse_event(event, OnAlarmEvent)
    rt = environment.runtime().invoked_as(context.invoked_function_arn)
    if isinstance(parsed, RecheckEvent):
        return decide.handle_recheck(parsed, rt)
    return decide.handle_alarm(parsed, rt)
