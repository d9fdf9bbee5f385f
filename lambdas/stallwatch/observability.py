"""Powertools singletons shared by the handlers and the control plane.

from stallwatch.observability import logger, metrics, tracer
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = "stallwatch"
# The control plane's own health metrics (not the agent's `Stallwatch` namespace).
METRICS_NAMESPACE = "Stallwatch/ControlPlane"

# The control plane's metric names (dimension `service`), for the health alarms and dashboards.
DECISIONS = "Decisions"
DUPLICATE_DECISIONS = "DuplicateDecisions"  # a duplicated event or a concurrent decision that lost the commit
JOBS_STOPPED = "JobsStopped"
STOP_FAILURES = "StopFailures"
SLACK_FAILURES = "SlackFailures"
MALFORMED_EVENTS = "MalformedEvents"
ALARMS_PUT = "AlarmsPut"
SWEEP_ERRORS = "SweepErrors"

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)
tracer = Tracer(service=SERVICE)
