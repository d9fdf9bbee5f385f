"""Fixtures for the Lambda tests: moto (with the SageMaker extension), a Slack receiver on 127.0.0.1, and the
runtime the handlers use, with a clock the tests can move."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import moto  # imported before any boto3 client is created
import pytest

from localrun import moto_sagemaker
from localrun.resources import create_table
from stallwatch import watchdog
from stallwatch.config import CONFIG_ENV
from tests.lambdas import moto_metric_index
from tests.lambdas.world import ALARM_ACTION_ARN, TABLE, Clock, LambdaContext, SlackReceiver, World

moto_sagemaker.install()
moto_metric_index.install()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN", CONFIG_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "1")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "1")


@pytest.fixture
def slack() -> Iterator[SlackReceiver]:
    with SlackReceiver() as receiver:
        yield receiver


@pytest.fixture
def context() -> LambdaContext:
    return LambdaContext()


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch, slack: SlackReceiver) -> Iterator[watchdog.Runtime]:
    """The handlers' runtime, built from the Lambda environment against moto; its clock is a `Clock`."""
    with moto.mock_aws():
        import boto3

        create_table(boto3.client("dynamodb"), TABLE)
        secret = boto3.client("secretsmanager").create_secret(
            Name="stallwatch/slack", SecretString=json.dumps({"webhook_url": slack.url})
        )
        monkeypatch.setenv("TABLE_NAME", TABLE)
        monkeypatch.setenv("SLACK_SECRET_ARN", secret["ARN"])
        monkeypatch.setenv("ALARM_ACTION_ARN", ALARM_ACTION_ARN)
        runtime = watchdog.Runtime.from_env()
        runtime.clock = Clock(time.time())
        monkeypatch.setattr(watchdog, "runtime", lambda: runtime)
        yield runtime


@pytest.fixture
def world(rt: watchdog.Runtime) -> World:
    return World(rt.clients, now=rt.clock())
