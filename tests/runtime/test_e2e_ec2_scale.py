"""End to end on moto: an EC2 job of hundreds of nodes (instances tagged `stallwatch:job`, the CloudWatch agent's
metrics by InstanceId, streams named by instance id) is decided by on_alarm within the 10-call budget, every
request within AWS's documented limits, as a SageMaker job's is (docs/lambdas.md, "Scale")."""

from __future__ import annotations

from collections import Counter

import pytest

from handlers import on_alarm
from localrun.moto_world import alarm_event
from stallwatch.core import alarms
from tests.fixtures.request_limits import recording

JOB = "llm-405b"
ON_ALARM_CALLS = 10
SERVICES = ("ec2", "cloudwatch", "logs", "dynamodb", "scheduler", "secretsmanager", "sagemaker")


pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nodes", [512, 1000])
def test_a_hung_ec2_job_of_hundreds_of_nodes_is_decided_within_the_call_budget(rt, world, slack, context, nodes):
    # Given a hung EC2 job of `nodes` instances, and a cold container (its first decision reads the Slack secret)
    world.hung_ec2_cluster(JOB, nodes)
    calls: Counter[str] = Counter()
    for service in SERVICES:
        getattr(rt.clients, service).meta.events.register("before-call", lambda model, **_: calls.update([model.name]))

    # When its progress alarm fires
    with recording() as requests:
        result = on_alarm.handler(
            alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "ec2", JOB, alarms.PROGRESS)), context
        )

    # Then it is diagnosed and warned in at most 10 calls, a cold container's, each request within its API's limits:
    # one DescribeInstances (the whole cluster), one GetMetricData (every node's series), no read per node
    assert (result["diagnosis"], result["action"]) == ("hang", "warn")
    assert sum(calls.values()) <= ON_ALARM_CALLS, calls
    assert calls["DescribeInstances"] == calls["GetMetricData"] == 1
    assert "DescribeLogStreams" not in calls
    assert [v for r in requests for v in r.violations()] == []
