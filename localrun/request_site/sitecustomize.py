"""Loaded by Python at start-up in the demo's training processes when the demo records its requests
(`localrun.request_log.child_env` puts this folder on their ``PYTHONPATH``)."""

from localrun.request_log import record_from_env

record_from_env()
