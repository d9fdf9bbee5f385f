"""End to end on moto, the deployed way: the stack's template on moto (its functions, their permissions, the
subscription filters its custom resource and CloudFormation put), a fatal line put to SageMaker's log group or the
EC2 group (PutLogEvents), the subscription delivering it to the real on_log_line, and a decision committed, warned and
posted, without any alarm or sweeper run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import moto
import pytest

from localrun import moto_ec2, moto_lambda_invoke, moto_logs_subscription
from localrun.moto_world import MINUTE, World
from localrun.resources import create_resources
from localrun.slack_receiver import SlackReceiver
from localrun.stack_on_moto import deploy_on_moto
from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.store import Store, job_key
from stallwatch.core import contract
from stallwatch.core.config import CONFIG_ENV
from tests.fixtures.moto_runtime import aws_env, slack  # noqa: F401 - moto's extensions, its environment, Slack
from tests.fixtures.templates import synthesized

STACK = "stallwatch"
JOB = "llama-3-70b"
FILTER = "stallwatch-fatal-lines"
CRASH = "RuntimeError: CUDA error: an illegal memory access was encountered"

moto_lambda_invoke.install()
moto_logs_subscription.install()


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The default deployment's template, synthesized as `cdk synth` does (offline)."""
    return synthesized(tmp_path_factory, "default")


@pytest.fixture
def deployed(template: dict[str, Any], slack: SlackReceiver) -> Iterator[dict[str, Any]]:  # noqa: F811
    """A fresh account (no SageMaker log group yet) with the stack deployed, and a running job whose rank died 10
    minutes ago (its GPUs idle since, the other host spinning), its logs quiet since: no alarm has fired."""
    with moto.mock_aws():
        resources = create_resources(
            boto3.client("dynamodb"), boto3.client("secretsmanager"), boto3.client("scheduler"), slack.url
        )
        deploy_on_moto(template, STACK, resources.secret_arn)
        world = World(AwsClients(), now=time.time())
        # stopped after the warning's 5 minutes: the invocation leaves the stop to the recheck's schedule
        world.create_job(JOB, hosts=2, tags={"stallwatch:mode": "enforce", "stallwatch:confirmed-grace-minutes": "5"})
        world.host_gpu(JOB, "algo-1", world.every_minute(110, 100.0))
        world.host_gpu(JOB, "algo-2", world.every_minute(110, lambda m: 100.0 if m > 10 else 0.0))
        for host in ("algo-1", "algo-2"):
            world.progress_logs(JOB, host, until_min=11)
        on_log_line = _function("handlers.on_log_line.handler")
        yield {"world": world, "table": on_log_line["Environment"]["Variables"]["TABLE_NAME"], "function": on_log_line}


def _function(handler: str) -> dict[str, Any]:
    return next(f for f in boto3.client("lambda").list_functions()["Functions"] if f["Handler"] == handler)


def test_a_fatal_line_put_to_the_log_group_is_decided_without_an_alarm_or_the_sweeper(
    deployed: dict[str, Any],
    slack: SlackReceiver,  # noqa: F811
) -> None:
    logs = boto3.client("logs")
    # Given the stack subscribed SageMaker's group, created for it (a fresh account), to its on_log_line function
    [subscription] = logs.describe_subscription_filters(logGroupName=contract.SAGEMAKER_LOG_GROUP)[
        "subscriptionFilters"
    ]
    assert (subscription["filterName"], subscription["destinationArn"]) == (FILTER, deployed["function"]["FunctionArn"])

    # When the dead rank's last words reach the log group
    world = deployed["world"]
    line_t = world.now - 10 * MINUTE
    logs.put_log_events(
        logGroupName=contract.SAGEMAKER_LOG_GROUP,
        logStreamName=f"{JOB}/algo-2-1700000000",
        logEvents=[
            {"timestamp": int(line_t * 1000), "message": m} for m in ("Traceback (most recent call last):", CRASH)
        ],
    )

    # Then the job was decided by the wake-up, warned and posted to Slack, and its decision audited with the stream
    audit_trail = AuditTrail(Store(boto3.client("dynamodb"), deployed["table"], ttl_days=90))
    [audit] = [r["record"] for r in audit_trail.records(job_key("sagemaker", JOB), "audit")]
    assert (audit["trigger"], audit["diagnosis"], audit["action"]) == (
        f"log:{JOB}/algo-2-1700000000",
        "crashed_rank",
        "warn",
    )
    assert "*algo-2*" in json.dumps(slack.posts[-1]["blocks"])
    # And no alarm existed to fire, and no function ran but the custom resource's (at deploy) and on_log_line
    assert boto3.client("cloudwatch").describe_alarms()["MetricAlarms"] == []
    invoked = {
        d["Value"]
        for m in boto3.client("cloudwatch").list_metrics(Namespace="AWS/Lambda", MetricName="Invocations")["Metrics"]
        for d in m["Dimensions"]
    }
    subscriber = _function("handlers.log_subscription.handler")
    assert invoked == {deployed["function"]["FunctionName"], subscriber["FunctionName"]}


def test_an_ec2_nodes_fatal_line_put_to_the_stacks_group_is_decided(deployed: dict[str, Any]) -> None:
    # Given a 2-node EC2 job whose node 2's rank died 10 minutes ago (its GPUs idle since), node 1 spinning, and the
    # stack's EC2 group subscribed to on_log_line
    world = deployed["world"]
    tags = {"stallwatch:job": "ec2-llm", "stallwatch:mode": "enforce", "stallwatch:confirmed-grace-minutes": "5"}
    nodes = world.launch(2, tags)  # stopped after the warning's 5 minutes: the recheck's schedule decides it
    moto_ec2.set_instance_times(nodes, launched=world.now - 120 * MINUTE)
    world.ec2_gpu(nodes[0], world.every_minute(110, 100.0))
    world.ec2_gpu(nodes[1], world.every_minute(110, lambda m: 100.0 if m > 10 else 0.0), memory_mib=0.0)
    config = json.loads(deployed["function"]["Environment"]["Variables"][CONFIG_ENV])
    group = config["ec2_log_group"]
    [subscription] = boto3.client("logs").describe_subscription_filters(logGroupName=group)["subscriptionFilters"]
    assert subscription["destinationArn"] == deployed["function"]["FunctionArn"]

    # When node 2's agent ships its log, the rank's last words at its end
    world.ec2_logs(nodes[1], [(m, f"step {110 - m} loss 2.3") for m in range(110, 10, -5)] + [(10, CRASH)], group)

    # Then the job its tags name is decided by the wake-up and warned, with no alarm
    audit_trail = AuditTrail(Store(boto3.client("dynamodb"), deployed["table"], ttl_days=90))
    [audit] = [r["record"] for r in audit_trail.records(job_key("ec2", "ec2-llm"), "audit")]
    assert (audit["trigger"], audit["diagnosis"], audit["action"]) == (f"log:{nodes[1]}", "crashed_rank", "warn")
    assert boto3.client("cloudwatch").describe_alarms()["MetricAlarms"] == []


def test_ordinary_lines_put_to_the_log_group_wake_nothing(deployed: dict[str, Any]) -> None:
    world = deployed["world"]
    boto3.client("logs").put_log_events(
        logGroupName=contract.SAGEMAKER_LOG_GROUP,
        logStreamName=f"{JOB}/algo-1-1700000000",
        logEvents=[{"timestamp": int(world.now * 1000), "message": "step 4100 loss 1.93 tokens/s 412000"}],
    )
    assert boto3.client("dynamodb").scan(TableName=deployed["table"])["Items"] == []
