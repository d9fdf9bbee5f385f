"""Every request the runtime makes stays within AWS's and Slack's documented limits: recorded on moto (which accepts
far more) through a job's whole life, for the longest job name SageMaker allows, past the 500 hosts one SEARCH
returns, and with as many tags as a job may carry. The demo's own runs are checked in tests/e2e/test_demo.py.

The limits and their references: tests/fixtures/request_limits.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from handlers import on_alarm, on_job_state, sweeper
from localrun import moto_sagemaker
from localrun.moto_world import MINUTE, alarm_event, instance_state_event, job_state_event, scheduled_event
from stallwatch.aws.metric_reads import SearchRef
from stallwatch.core import alarms
from stallwatch.core.contract import SAGEMAKER_NAMESPACE
from tests.fixtures.request_limits import Request, recording, slack_violations

LONGEST_JOB = "pretrain-llama-70b-" + "x" * 40 + "-123"  # 63 characters, SageMaker's longest name
USER_TAGS = {f"team:cost-center-{i:02d}": "ml-platform" for i in range(46)}
OPTED_IN = {"stallwatch:mode": "enforce", "stallwatch:resume": "2", **USER_TAGS}  # 48 tags


def _violations(requests: list[Request]) -> list[str]:
    return sorted({v for request in requests for v in request.violations()})


def _seed_hang(world, job: str, hosts: int) -> None:
    """A hang 40 minutes ago on every host: GPUs pinned, power fallen, logs quiet (every 5 minutes, to stay quick)."""
    world.steps_until(job, last_step_min=40, start_min=110)
    for i in range(1, hosts + 1):
        host = f"algo-{i}"
        points = [(world.now - m * MINUTE, 100.0) for m in range(110, -1, -5)]
        world.host_gpu(job, host, points)
        power = [(t, 390.0 if world.now - t > 40 * MINUTE else 95.0) for t, _ in points]
        world.agent_host(job, host, "GPUPowerWatts", power)
        world.progress_logs(job, host, until_min=40)


def test_the_limit_checks_catch_what_aws_and_slack_refuse() -> None:
    # Given requests moto takes but AWS refuses: the SEARCH the 512-host read of a 63-character job once made,
    # the demo's old 2-second period, a resume of 52 tags, and a Slack section of 3,001 characters
    excluded = tuple(("Host", f"{LONGEST_JOB}/algo-{i}") for i in range(501, 513))
    search = SearchRef(
        SAGEMAKER_NAMESPACE, "GPUUtilization", ("Host",), (), "Average", "", f"{LONGEST_JOB}/", excluded=excluded
    )
    expression = search.expression(60)
    now = datetime.now(UTC)
    period_two = {"Id": "q0", "MetricStat": {"Metric": {"Namespace": "Stallwatch", "MetricName": "Steps"}, "Period": 2}}
    bad = [
        Request(
            "cloudwatch",
            "GetMetricData",
            {
                "MetricDataQueries": [{"Id": "q0", "Expression": expression}],
                "StartTime": now,
                "EndTime": now.replace(year=now.year + 1),
            },
        ),
        Request(
            "cloudwatch",
            "GetMetricData",
            {"MetricDataQueries": [period_two], "StartTime": now, "EndTime": now.replace(year=now.year + 1)},
        ),
        Request(
            "sagemaker",
            "CreateTrainingJob",
            {"TrainingJobName": LONGEST_JOB + "-r1", "Tags": [{"Key": f"k{i}", "Value": "v"} for i in range(52)]},
        ),
    ]

    bad += [
        Request("cloudwatch", "ListMetrics", {"Namespace": "CWAgent", "RecentlyActive": "PT1H"}),
        Request("scheduler", "DeleteSchedule", {"Name": "ec2.team/run 3", "GroupName": "stallwatch-rechecks"}),
        Request(
            "cloudwatch",
            "PutMetricAlarm",
            {
                "AlarmName": "a",
                "InsufficientDataActions": [f"arn:aws:lambda:us-east-1:1:function:f{i}" for i in range(6)],
            },
        ),
    ]

    # Then each is named with the limit it crosses
    found = [request.violations() for request in bad]
    assert any("only PT3H" in v for v in found[3])
    assert any("DeleteSchedule: Name 'ec2.team/run 3'" in v for v in found[4])
    assert any("INSUFFICIENT_DATA actions: 6 > 5" in v for v in found[5])
    assert f"SEARCH: {len(expression)} characters, not 1..1024" in " ".join(found[0])
    assert "period 2 s" in " ".join(found[1])
    assert any("tags: 52 > 50" in v for v in found[2])
    assert any("is not a SageMaker job name" in v for v in found[2])  # 66 characters
    section = {"text": "x", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "y" * 3001}}]}
    assert any("3000" in v for v in slack_violations(section))


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [600])  # past 524: a SEARCH, hosts left out of it, and a second call by name
def test_a_sagemaker_job_of_hundreds_of_hosts_is_watched_stopped_and_resumed_within_the_limits(
    rt, world, slack, context, hosts: int
) -> None:
    # Given a running job of the longest name, `hosts` hosts and 48 tags, hung for 40 minutes, that opted in to resume
    world.create_job(LONGEST_JOB, hosts=hosts, tags=OPTED_IN, checkpoint="s3://bucket/ckpt")
    _seed_hang(world, LONGEST_JOB, hosts)
    prefix = rt.config.alarm_prefix

    # When its whole life runs under the recorder: start, sweeps, alarms, the stop, the Stopped event and the resume
    with recording() as requests:
        on_job_state.handler(job_state_event(LONGEST_JOB, "InProgress", hosts=hosts, tags=OPTED_IN), context)
        sweeper.handler(scheduled_event(), context)
        rt.clock.advance(MINUTE)
        on_alarm.handler(alarm_event(alarms.alarm_name(prefix, "sagemaker", LONGEST_JOB, alarms.PROGRESS)), context)
        rt.clock.advance(6 * MINUTE)
        sweeper.handler(scheduled_event(), context)
        moto_sagemaker.set_training_job_status(LONGEST_JOB, "Stopped", "Stopped")
        resumed = on_job_state.handler(job_state_event(LONGEST_JOB, "Stopped", hosts=hosts, tags=OPTED_IN), context)

    # Then the job was stopped and resumed, and no request crossed a documented limit, nor did any Slack message
    assert resumed["resume"]["status"] == "resumed", resumed
    operations = {r.operation for r in requests}
    assert {"PutMetricAlarm", "GetMetricData", "PutMetricData", "StopTrainingJob", "CreateTrainingJob"} <= operations
    assert _violations(requests) == []
    assert slack.posts
    assert [v for post in slack.posts for v in slack_violations(post)] == []


@pytest.mark.slow
def test_an_ec2_cluster_is_watched_and_stopped_within_the_limits(rt, world, slack, context) -> None:
    # Given 130 running nodes of one enforced job (their 520 series read by name pass one GetMetricData's 500
    # queries), tagged as launch.sh tags them
    job = "llm-" + "y" * 59
    ids = world.launch(130, {"stallwatch:job": job, "stallwatch:mode": "enforce"})
    points = [(world.now - m * MINUTE, 100.0) for m in range(110, -1, -10)]
    for instance in ids[:20]:  # a few nodes' GPU metrics: the reads are the same whichever have data
        world.ec2_gpu(instance, points)
    world.steps_until(job, last_step_min=40, start_min=110)
    prefix = rt.config.alarm_prefix

    # When a node's running event, the sweeps and the job's progress alarm run under the recorder
    with recording() as requests:
        on_job_state.handler(instance_state_event(ids[0], "running"), context)
        sweeper.handler(scheduled_event(), context)
        rt.clock.advance(MINUTE)
        on_alarm.handler(alarm_event(alarms.alarm_name(prefix, "ec2", job, alarms.PROGRESS)), context)
        rt.clock.advance(6 * MINUTE)
        sweeper.handler(scheduled_event(), context)

    # Then the nodes were stopped, and no request crossed a documented limit, nor did any Slack message
    assert {"PutMetricAlarm", "GetMetricData", "DescribeInstances", "StopInstances"} <= {r.operation for r in requests}
    assert _violations(requests) == []
    assert [v for post in slack.posts for v in slack_violations(post)] == []
