"""The boto3 clients every adapter shares: one session, lazily created clients, adaptive retries, and AWS's
timestamps parsed without dateutil.

clients = AwsClients()          # nothing touches the network until a client is used
clients.cloudwatch.describe_alarms(...)
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import boto3
import botocore.session
from botocore.config import Config
from botocore.utils import parse_timestamp

RETRY_CONFIG = Config(retries={"mode": "adaptive", "max_attempts": 6}, connect_timeout=5, read_timeout=20)


def aws_timestamp(value: str | float) -> datetime:
    """A response's timestamp, the instant botocore's parser reads: epoch seconds (a number or its text) and ISO 8601
    read directly, in UTC; anything else (RFC 822) by botocore. botocore's own reads each through dateutil and a new
    local zone: a 1,000-instance DescribeInstances parses in 0.63 of its CPU (bench/response_timestamps.py)."""
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        pass
    try:
        return datetime.fromisoformat(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return parse_timestamp(value)


class AwsClients:
    """Lazily created boto3 clients sharing one session and the adaptive retry config.

    Nothing touches the network until a client is used; endpoints follow the environment
    (``AWS_ENDPOINT_URL`` points them at a moto server for the local demo)."""

    def __init__(self, region: str | None = None, config: Config = RETRY_CONFIG) -> None:
        self.region = region
        self.config = config

    @cached_property
    def session(self) -> boto3.Session:
        core = botocore.session.get_session()
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=aws_timestamp)
        return boto3.Session(botocore_session=core, region_name=self.region)

    def _client(self, service: str) -> Any:
        return self.session.client(service, config=self.config)

    @cached_property
    def cloudwatch(self) -> Any:
        return self._client("cloudwatch")

    @cached_property
    def logs(self) -> Any:
        return self._client("logs")

    @cached_property
    def sagemaker(self) -> Any:
        return self._client("sagemaker")

    @cached_property
    def ec2(self) -> Any:
        return self._client("ec2")

    @cached_property
    def dynamodb(self) -> Any:
        return self._client("dynamodb")

    @cached_property
    def secretsmanager(self) -> Any:
        return self._client("secretsmanager")

    @cached_property
    def scheduler(self) -> Any:
        return self._client("scheduler")

    @cached_property
    def ssm(self) -> Any:
        return self._client("ssm")

    @cached_property
    def autoscaling(self) -> Any:
        return self._client("autoscaling")

    @cached_property
    def lambda_(self) -> Any:
        return self._client("lambda")
