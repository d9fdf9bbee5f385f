"""Powertools singletons shared by the handlers and the control plane.

from stallwatch.aws.observability import logger, metrics, tracer
"""

from __future__ import annotations

import logging

from aws_lambda_powertools import Logger, Metrics, Tracer

from stallwatch.core.contract import CONTROL_PLANE_NAMESPACE, SERVICE

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=CONTROL_PLANE_NAMESPACE, service=SERVICE)
tracer = Tracer(service=SERVICE)

# slack_sdk logs the full request URL when it retries; a webhook URL is a secret and must not reach the logs.
logging.getLogger("slack_sdk").setLevel(logging.WARNING)
