"""Powertools singletons shared by the handlers and the control plane.

from stallwatch.observability import logger, metrics, tracer
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = "stallwatch"
# The control plane's own health metrics (not the agent's `Stallwatch` namespace).
METRICS_NAMESPACE = "Stallwatch/ControlPlane"

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)
tracer = Tracer(service=SERVICE)
