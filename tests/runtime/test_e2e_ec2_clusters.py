"""End to end on moto: EC2 training clusters as one job (instances sharing `stallwatch:job`), their logs, one stop
for all; and heterogeneous SageMaker clusters (ResourceConfig.InstanceGroups)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from botocore.awsrequest import AWSResponse

from handlers import on_alarm, on_job_state, sweeper
from localrun.moto_world import (
    MINUTE,
    World,
    alarm_event,
    all_alarms,
    instance_state_event,
    job_state_event,
    scheduled_event,
)
from stallwatch.aws import actions
from stallwatch.aws.platforms import adapter
from stallwatch.aws.store import job_key
from stallwatch.core import alarms
from stallwatch.core.signals import Platform

JOB = "llm-70b"
NCCL_CRASH = [
    "[rank 16] RuntimeError: CUDA error: an illegal memory access was encountered",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED",
]


def _alarm_names(rt, platform: str, job: str) -> list[str]:
    prefix = alarms.job_alarm_prefix(rt.config.alarm_prefix, platform, job)
    pages = rt.clients.cloudwatch.get_paginator("describe_alarms").paginate(AlarmNamePrefix=prefix)
    return sorted(a["AlarmName"] for page in pages for a in page["MetricAlarms"])


def _audits(rt, platform: str, job: str) -> list[dict[str, Any]]:
    return [r["record"] for r in rt.audit.records(job_key(platform, job), "audit")]


def _record_stop_calls(rt) -> list[list[str]]:
    """Every StopInstances call's InstanceIds, as the functions send them."""
    calls: list[list[str]] = []
    rt.clients.ec2.meta.events.register(
        "provide-client-params.ec2.StopInstances", lambda params, **_: calls.append(list(params["InstanceIds"]))
    )
    return calls


def _seed_ec2_hang(world: World, instances: list[str]) -> None:
    """The agent (JobName = the job tag, Host = the instance id): steps stop 40 min ago; GPUs stay pinned at 100 %
    while power falls; the nodes' logs (CloudWatch agent, stream = instance id) stop with them."""
    world.steps_until(JOB, last_step_min=40)
    for instance in instances:
        world.ec2_gpu(instance, world.every_minute(110, 100.0))
        world.agent_host(JOB, instance, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))
        world.ec2_logs(instance, [(m, f"step {110 - m} loss 2.31") for m in range(110, 39, -5)])


def test_a_hung_4_node_ec2_job_is_warned_once_then_stopped_by_one_stop_instances(rt, world, slack, context) -> None:
    # Given 4 instances of one job, tagged enforce, each reported running
    instances = world.launch(4, {"stallwatch:job": JOB, "stallwatch:mode": "enforce"})
    provisioned = [on_job_state.handler(instance_state_event(i, "running"), context) for i in instances]
    _seed_ec2_hang(world, instances)
    stop_calls = _record_stop_calls(rt)

    # When the job's progress alarm fires, and the sweeper runs after the grace period
    warned = on_alarm.handler(
        alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "ec2", JOB, alarms.PROGRESS)), context
    )
    rt.clock.advance(6 * MINUTE)
    (stopped,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then the job has one set of alarms (3 per node, 3 for the job), was warned once and stopped by one call
    assert provisioned[-1]["alarms"] == 4 * 3 + 3
    assert len(_alarm_names(rt, "ec2", JOB)) == 15
    assert (warned["job"], warned["diagnosis"], warned["action"]) == (JOB, "hang", "warn")
    assert (stopped["action"], stopped["stopped"]) == ("stop", True)
    assert stop_calls == [instances]
    assert {world.instance_state(i) for i in instances} <= {"stopping", "stopped"}
    warning, stop = slack.texts()
    assert "will be stopped" in warning
    assert JOB in warning
    assert "stop requested (4 of 4 instances stopping)" in stop
    assert "4 x p4d.24xlarge" in str(slack.posts[-1]["blocks"])

    # And when the first stopped instance reports, the job has ended: its alarms go
    retired = on_job_state.handler(instance_state_event(instances[0], "stopping"), context)
    assert (retired["status"], retired["job"], retired["alarms_deleted"]) == ("retired", JOB, 15)


def test_a_node_crash_without_the_agent_is_diagnosed_from_the_nodes_logs(rt, world, slack, context) -> None:
    # Given 4 nodes without the agent: node 3 logged a CUDA error 20 min ago and released its GPUs; the others spin
    instances = world.launch(4, {"stallwatch:job": JOB})
    on_job_state.handler(instance_state_event(instances[0], "running"), context)
    crashed = instances[2]
    for instance in instances:
        busy = lambda m: 97.0 if m > 20 else 100.0  # noqa: E731 - spinning in the collective after the crash
        world.ec2_gpu(instance, world.every_minute(110, 0.0 if instance == crashed else busy))
        lines = [(m, f"step {110 - m} loss 2.31") for m in range(110, 20, -1)]
        world.ec2_logs(instance, lines + ([(20, line) for line in NCCL_CRASH] if instance == crashed else []))

    # When the crashed node's GPU-memory alarm fires
    name = alarms.alarm_name(rt.config.alarm_prefix, "ec2", JOB, alarms.GPU_MEMORY, crashed)
    result = on_alarm.handler(alarm_event(name), context)

    # Then the crash is diagnosed from its log lines, and Slack shows them
    assert (result["job"], result["diagnosis"], result["action"]) == (JOB, "crashed_rank", "alert")
    assert "illegal memory access" in str(slack.posts[0]["blocks"])


def test_nodes_joining_and_leaving_update_the_jobs_alarms_and_the_last_one_ends_it(rt, world, context) -> None:
    # Given a job of 2 running nodes
    first = world.launch(2, {"stallwatch:job": JOB})
    for instance in first:
        on_job_state.handler(instance_state_event(instance, "running"), context)
    (joined,) = world.launch(1, {"stallwatch:job": JOB})

    # When a third node joins, then one leaves, then the rest stop
    grown = on_job_state.handler(instance_state_event(joined, "running"), context)
    after_grow = _alarm_names(rt, "ec2", JOB)
    rt.clients.ec2.stop_instances(InstanceIds=[first[0]])
    shrunk = on_job_state.handler(instance_state_event(first[0], "stopped"), context)
    after_shrink = _alarm_names(rt, "ec2", JOB)
    rt.clients.ec2.stop_instances(InstanceIds=[first[1], joined])
    on_job_state.handler(instance_state_event(first[1], "stopped"), context)
    ended = on_job_state.handler(instance_state_event(joined, "stopped"), context)

    # Then the alarms follow the nodes: 3 x 3 + 3, then 2 x 3 + 3 without the one that left, then none
    assert grown["alarms"] == 12
    assert len(after_grow) == 12
    assert (shrunk["alarms"], shrunk["alarms_deleted"]) == (9, 3)
    assert not any(first[0] in name for name in after_shrink)
    assert ended["status"] == "retired"
    assert _alarm_names(rt, "ec2", JOB) == []


def test_the_sweeper_catches_a_node_whose_running_event_was_missed(rt, world, context) -> None:
    # Given a 2-node job with its alarms, and a third node that joined without its event reaching on_job_state
    first = world.launch(2, {"stallwatch:job": JOB})
    on_job_state.handler(instance_state_event(first[0], "running"), context)
    (joined,) = world.launch(1, {"stallwatch:job": JOB})

    # When the sweeper runs
    summary = sweeper.handler(scheduled_event(), context)

    # Then the job's alarms now watch all three nodes
    assert summary["alarms_provisioned"] == 1
    assert len(_alarm_names(rt, "ec2", JOB)) == 3 * 3 + 3
    assert any(joined in name for name in _alarm_names(rt, "ec2", JOB))


def test_the_sweeper_publishes_each_nodes_log_idleness_from_its_stream(rt, world, context) -> None:
    # Given a 2-node job whose nodes last logged 20 and 3 minutes ago (streams named by instance id)
    nodes = world.launch(2, {"stallwatch:job": JOB})
    world.ec2_logs(nodes[0], [(30, "step 1"), (20, "step 2")])
    world.ec2_logs(nodes[1], [(30, "step 1"), (3, "step 9")])

    # When the sweeper runs
    summary = sweeper.handler(scheduled_event(), context)

    # Then each node's LogIdleSeconds is published under the job, the input of its log-idle alarm
    assert summary["log_idle_published"] == 2
    idle = {}
    for node in nodes:
        stats = rt.clients.cloudwatch.get_metric_statistics(
            Namespace="Stallwatch",
            MetricName="LogIdleSeconds",
            Dimensions=[{"Name": "JobName", "Value": JOB}, {"Name": "Host", "Value": node}],
            StartTime=datetime.fromtimestamp(world.now - 600, UTC),
            EndTime=datetime.fromtimestamp(world.now + 600, UTC),
            Period=60,
            Statistics=["Maximum"],
        )
        idle[node] = round(stats["Datapoints"][0]["Maximum"] / 60)
    assert idle == {nodes[0]: 20, nodes[1]: 3}


def test_tags_that_disagree_across_nodes_are_audited_and_the_safer_mode_applies(rt, world, slack, context) -> None:
    # Given a hung job whose nodes disagree on the mode: three say enforce, one says observe
    instances = world.launch(3, {"stallwatch:job": JOB, "stallwatch:mode": "enforce"})
    instances += world.launch(1, {"stallwatch:job": JOB, "stallwatch:mode": "observe"})
    _seed_ec2_hang(world, instances)
    provisioned = on_job_state.handler(instance_state_event(instances[0], "running"), context)

    # When its progress alarm fires, and again after the grace period
    name = alarms.alarm_name(rt.config.alarm_prefix, "ec2", JOB, alarms.PROGRESS)
    first = on_alarm.handler(alarm_event(name), context)
    rt.clock.advance(6 * MINUTE)
    on_alarm.handler(alarm_event(name, timestamp="2026-11-30T10:06:00.000+0000"), context)

    # Then the disagreement is a tag error, in the provisioning result and in every audit record; observe applies
    assert any("stallwatch:mode" in e for e in provisioned["tag_errors"])
    assert first["diagnosis"] == "hang"
    records = _audits(rt, "ec2", JOB)
    assert {r["mode"] for r in records} == {"observe"}
    assert all(any("stallwatch:mode" in e for e in r["tag_errors"]) for r in records)
    assert {world.instance_state(i) for i in instances} == {"running"}
    assert slack.posts == []


def test_a_single_tagged_instance_is_its_own_job_named_by_its_id(rt, world, context) -> None:
    # Given one instance tagged only stallwatch:monitor=true (its agent needs no variable: JobName = instance id)
    (instance,) = world.launch(1, {"stallwatch:monitor": "true"}, instance_type="g5.12xlarge")

    # When it reports running
    result = on_job_state.handler(instance_state_event(instance, "running"), context)

    # Then it is a one-host job named by its id, its GPU alarms per device of its 4 GPUs
    facts = adapter(Platform.EC2, rt.clients).facts(instance)
    assert (result["job"], result["alarms"]) == (instance, 6)
    assert (facts.instance_ids, facts.gpus_per_host) == ((instance,), 4)


def _refuse_stop_of(rt, refused: str) -> None:
    """IAM's answer when a StopInstances call names an instance without the opt-in tag: the whole call fails."""

    def refuse(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if refused not in str(params["body"]):  # the serialized request: InstanceId.1=...
            return None
        error = {"Code": "UnauthorizedOperation", "Message": "You are not authorized to perform this operation."}
        return AWSResponse("https://ec2", 403, {}, None), {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 403}}

    rt.clients.ec2.meta.events.register("before-call.ec2.StopInstances", refuse)


def test_an_instance_that_refuses_the_stop_is_recorded_and_the_others_stop(rt, world) -> None:
    # Given a 3-node job where StopInstances is refused for one node
    instances = world.launch(3, {"stallwatch:job": JOB, "stallwatch:mode": "enforce"})
    _refuse_stop_of(rt, instances[1])
    facts = adapter(Platform.EC2, rt.clients).facts(JOB)

    # When the job is stopped
    result = actions.stop(rt.source(facts.platform), facts)

    # Then the other two stop, the refusal is named, and the stop counts as failed (the sweeper retries it)
    assert (result.ok, result.stopped, result.targets) == (False, 2, 3)
    assert result.count == "2 of 3 instances stopping"
    assert f"{instances[1]}: UnauthorizedOperation" in result.detail
    assert [world.instance_state(i) for i in instances][1] == "running"
    assert {world.instance_state(i) for i in (instances[0], instances[2])} <= {"stopping", "stopped"}


GROUPS = [
    {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
    {"InstanceGroupName": "embed", "InstanceType": "ml.g5.12xlarge", "InstanceCount": 2},
]


def test_a_heterogeneous_sagemaker_job_gets_alarms_for_every_host_and_is_stopped(rt, world, slack, context) -> None:
    # Given a heterogeneous training job (2 x p4d with 8 GPUs, 2 x g5.12xlarge with 4) hung for 40 minutes
    job = "hetero-pretrain"
    world.create_job(job, tags={"stallwatch:mode": "enforce"}, groups=GROUPS)
    world.steps_until(job, last_step_min=40)
    for host, gpus in (("algo-1", 8), ("algo-2", 8), ("algo-3", 4), ("algo-4", 4)):
        world.host_gpu(job, host, world.every_minute(110, 100.0), gpus=gpus)
        world.agent_host(job, host, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))

    # When its state-change event arrives, its progress alarm fires, and the sweeper runs after the grace period
    provisioned = on_job_state.handler(job_state_event(job, "InProgress", groups=GROUPS), context)
    definitions = {a["AlarmName"]: a for a in _described(rt, job)}
    warned = on_alarm.handler(
        alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, "progress")), context
    )
    rt.clock.advance(6 * MINUTE)
    (stopped,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then every host has its alarms, with GPU utilization per device of its own group's type
    assert provisioned["alarms"] == 4 * 3 + 3
    gpu_idle = {
        ref.host: d
        for n, d in definitions.items()
        if (ref := alarms.parse_alarm_name(n, rt.config.alarm_prefix)).kind == "gpu-idle"
    }
    assert sorted(gpu_idle) == ["algo-1", "algo-2", "algo-3", "algo-4"]
    assert _expression(gpu_idle["algo-1"]) == "m1 / 8"
    assert _expression(gpu_idle["algo-3"]) == "m1 / 4"
    # And it is decided and stopped like any job; Slack names both instance types
    assert (warned["diagnosis"], warned["action"]) == ("hang", "warn")
    assert (stopped["action"], stopped["stopped"]) == ("stop", True)
    assert world.status(job) in ("Stopping", "Stopped")
    assert "2 x ml.p4d.24xlarge + 2 x ml.g5.12xlarge" in str(slack.posts[0]["blocks"])


def _described(rt, job: str) -> list[dict[str, Any]]:
    prefix = alarms.job_alarm_prefix(rt.config.alarm_prefix, "sagemaker", job)
    return all_alarms(rt.clients.cloudwatch, AlarmNamePrefix=prefix)


def _expression(alarm: dict[str, Any]) -> str:
    return next(m["Expression"] for m in alarm["Metrics"] if m.get("Expression"))
