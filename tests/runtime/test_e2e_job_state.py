"""End to end on moto: on_job_state provisions and retires alarms; the sweeper publishes log idleness and repairs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from botocore.exceptions import ClientError

from handlers import on_alarm, on_job_state, sweeper
from localrun.moto_world import MINUTE, alarm_event, all_alarms, instance_state_event, job_state_event, scheduled_event
from stallwatch.aws import actions
from stallwatch.aws.platforms import adapter
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, contract
from stallwatch.core.signals import Platform
from stallwatch.runtime import environment
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, seed_nccl_hang

JOB = "whisper-large-ft"
EXAMPLE_AMI = "ami-12c6146b"  # one of moto's built-in images


def _alarm_names(rt) -> list[str]:
    return sorted(a["AlarmName"] for a in all_alarms(rt.clients.cloudwatch))


def test_in_progress_job_gets_per_host_alarms_from_its_tags(rt, world, context) -> None:
    # Given a running 4-host job that sets its own confirmation (and one bad tag)
    world.create_job(JOB, hosts=4, tags={"stallwatch:crash-confirm-minutes": "4", "stallwatch:idle-minutes": "soon"})

    # When SageMaker reports it InProgress
    result = on_job_state.handler(job_state_event(JOB, "InProgress", hosts=4), context)

    # Then every host has its three alarms and the job its three, honouring the tag and reporting the bad one
    names = _alarm_names(rt)
    assert result["alarms"] == len(names) == 4 * 3 + 3
    assert _alarm(rt, JOB, alarms.GPU_IDLE, "algo-4") in names
    progress = rt.clients.cloudwatch.describe_alarms(AlarmNames=[_alarm(rt, JOB)])["MetricAlarms"][0]
    assert progress["EvaluationPeriods"] == 4  # crash_confirm_minutes: when conclusive evidence may first decide
    assert progress["AlarmActions"] == [rt.alarm_action_arn]
    assert "stallwatch:idle-minutes" in result["tag_errors"][0]


def test_ended_job_loses_its_alarms_and_its_incident_is_closed(rt, world, slack, context) -> None:
    # Given a hung job with alarms and an open incident
    seed_nccl_hang(world, JOB, {"stallwatch:mode": "notify"})
    on_job_state.handler(job_state_event(JOB, "InProgress"), context)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    key = job_key("sagemaker", JOB)
    assert rt.states.load(key).incident is not None

    # When the job fails
    result = on_job_state.handler(job_state_event(JOB, "Failed"), context)

    # Then its alarms are gone and the incident is closed with the reason
    assert (result["alarms_deleted"], result["incident_closed"]) == (9, True)
    assert _alarm_names(rt) == []
    (incident,) = rt.audit.records(key, "incident")
    assert (incident["status"], incident["close_reason"]) == ("closed", "job Failed")
    assert incident["expires_at"] > rt.clock()


def test_ec2_instances_are_watched_only_when_tagged(rt, world, context) -> None:
    # Given two running GPU instances, one tagged for monitoring
    ec2 = rt.clients.ec2
    tagged, untagged = (
        ec2.run_instances(
            ImageId=EXAMPLE_AMI,
            InstanceType="p4d.24xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )["Instances"][0]["InstanceId"]
        for tags in ({"stallwatch:monitor": "true"}, {"team": "nlp"})
    )

    # When both report running
    watched = on_job_state.handler(instance_state_event(tagged, "running"), context)
    ignored = on_job_state.handler(instance_state_event(untagged, "running"), context)

    # Then only the tagged one has alarms (one host: 3 host alarms + 3 job alarms), and stopping it removes them
    assert (watched["status"], watched["alarms"]) == ("alarms_put", 6)
    assert ignored["status"] == "ignored"
    assert all(f".{tagged}." in name for name in _alarm_names(rt))
    assert on_job_state.handler(instance_state_event(tagged, "stopped"), context)["alarms_deleted"] == 6
    assert _alarm_names(rt) == []


def test_sweeper_publishes_log_idleness_and_recreates_missing_alarms(rt, world, context) -> None:
    # Given a running job whose hosts last logged 10 and 40 minutes ago, and whose alarms were never created
    world.create_job(JOB, hosts=2, tags=ENFORCE)
    world.logs(JOB, "algo-1", [(12, "step 1"), (10, "step 2")])
    world.logs(JOB, "algo-2", [(40, "step 1")])

    # When the sweeper runs
    summary = sweeper.handler(scheduled_event(), context)

    # Then each host's LogIdleSeconds is published, and the job's alarms exist
    assert (summary["running"], summary["log_idle_published"], summary["alarms_provisioned"]) == (1, 2, 1)
    assert len(_alarm_names(rt)) == 9
    idle = {}
    for host in ("algo-1", "algo-2"):
        stats = rt.clients.cloudwatch.get_metric_statistics(
            Namespace=contract.NAMESPACE,
            MetricName=contract.LOG_IDLE_SECONDS,
            Dimensions=[{"Name": contract.DIM_JOB, "Value": JOB}, {"Name": contract.DIM_HOST, "Value": host}],
            StartTime=datetime.fromtimestamp(rt.clock() - 5 * MINUTE, UTC),
            EndTime=datetime.fromtimestamp(rt.clock() + 5 * MINUTE, UTC),
            Period=60,
            Statistics=["Maximum"],
        )
        idle[host] = stats["Datapoints"][0]["Maximum"]
    assert round(idle["algo-1"]) == 600
    assert round(idle["algo-2"]) == 2400
    # And a job with nothing pending is not re-decided
    assert summary["redecided"] == []


def test_alarm_back_to_ok_and_foreign_alarms_are_ignored(rt, world, slack, context) -> None:
    seed_nccl_hang(world, JOB, ENFORCE)
    ok = on_alarm.handler(alarm_event(_alarm(rt, JOB), state="OK"), context)
    foreign = on_alarm.handler(alarm_event("billing-alarm"), context)
    assert (ok["status"], foreign["status"]) == ("ignored", "ignored")
    assert slack.posts == []


def test_stop_results_for_ec2_and_for_a_job_that_is_gone(rt, world) -> None:
    # Given a running GPU instance and a training job that does not exist
    instance = rt.clients.ec2.run_instances(ImageId=EXAMPLE_AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
    instance_id = instance["Instances"][0]["InstanceId"]
    ec2_facts = adapter(Platform.EC2, rt.clients).facts(instance_id)
    ghost = replace(ec2_facts, name="ghost-job", platform=Platform.SAGEMAKER, instance_ids=())

    # When both are stopped, Then the instance stops and the missing job is a reported failure, not an exception
    assert actions.stop(rt.source(ec2_facts.platform), ec2_facts).ok
    assert rt.clients.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"][
        "Name"
    ] in ("stopping", "stopped")
    failed = actions.stop(rt.source(ghost.platform), ghost)
    assert not failed.ok
    assert "ghost-job" in failed.detail


def test_missing_table_name_is_a_clear_configuration_error(monkeypatch) -> None:
    monkeypatch.delenv("TABLE_NAME", raising=False)
    with pytest.raises(environment.ConfigurationError, match="TABLE_NAME"):
        environment.Runtime.from_env()


def test_one_jobs_alarm_failure_does_not_stop_the_sweep(rt, world, context) -> None:
    # Given two running jobs without alarms, and CloudWatch refusing the first one's alarms
    world.create_job("job-a", hosts=1)
    world.create_job("job-b", hosts=1)

    def refuse_job_a(params: dict, **kwargs: object) -> None:
        if ".job-a." in params["AlarmName"]:
            raise ClientError({"Error": {"Code": "LimitExceeded", "Message": "too many alarms"}}, "PutMetricAlarm")

    rt.clients.cloudwatch.meta.events.register("before-parameter-build.cloudwatch.PutMetricAlarm", refuse_job_a)

    # When the sweeper runs, Then job-b gets its alarms and job-a's failure is counted
    summary = sweeper.handler(scheduled_event(), context)
    assert (summary["alarms_provisioned"], summary["provisioning_errors"]) == (1, 1)
    assert all(".job-b." in name for name in _alarm_names(rt))
    assert len(_alarm_names(rt)) == 6


def test_missing_alarm_action_is_a_clear_configuration_error(rt, world, context) -> None:
    world.create_job(JOB)
    rt.alarm_action_arn = ""
    with pytest.raises(environment.ConfigurationError, match="ALARM_ACTION_ARN"):
        on_job_state.handler(job_state_event(JOB, "InProgress"), context)
    assert _alarm_names(rt) == []
