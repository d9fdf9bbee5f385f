"""Powertools singletons shared by the handlers and the control plane.

from stallwatch.aws.observability import logger, metrics, tracer
"""

from __future__ import annotations

import logging
import os

from aws_lambda_powertools import Logger, Metrics, Tracer

from stallwatch.core.contract import CONTROL_PLANE_NAMESPACE, SERVICE

# The deployment's name (the stack sets it), so two deployments in one account and region keep their health apart.
service = os.environ.get("POWERTOOLS_SERVICE_NAME") or SERVICE
logger = Logger(service=service)
metrics = Metrics(namespace=CONTROL_PLANE_NAMESPACE, service=service)
tracer = Tracer(service=service)

# Libraries that log secrets below WARNING: botocore the GetSecretValue response (signing secret, bot token,
# webhook URL), urllib3 and slack_sdk the request URL (a webhook URL is a secret). Capped whatever the root level.
SECRET_LOGGING_LIBRARIES = ("botocore", "boto3", "s3transfer", "urllib3", "slack_sdk")


def cap_library_loggers() -> None:
    """Keep the libraries that log secrets at WARNING and above, even with the root logger at DEBUG."""
    for name in SECRET_LOGGING_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)


cap_library_loggers()
