"""CloudFormation's custom resource `Custom::FatalLineSubscription`: this deployment's subscription filter on
SageMaker's shared log group, where one of its two slots is free (`runtime.log_subscription`)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.observability import logger
from stallwatch.runtime import log_subscription


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return log_subscription.handle_request(event, AwsClients())
