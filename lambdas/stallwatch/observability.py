"""Powertools singletons shared by the handlers and the control plane.

from stallwatch.observability import logger, metrics, tracer
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

from stallwatch.contract import CONTROL_PLANE_NAMESPACE, SERVICE

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=CONTROL_PLANE_NAMESPACE, service=SERVICE)
tracer = Tracer(service=SERVICE)
