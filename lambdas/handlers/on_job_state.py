"""SageMaker training job / EC2 instance state changes: create a running job's alarms, retire an ended job's."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.events import JobStateEvent, parse_event
from stallwatch.aws.observability import logger, metrics, tracer
from stallwatch.runtime import environment, provision


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return provision.on_job_state(parse_event(event, JobStateEvent), environment.runtime())
