"""End to end on moto: recovery in place. A hung EC2 cluster tagged `stallwatch:recover=restart` is checked node by
node through SSM (the health-check document runs on simulated GPU nodes), restarted in place on healthy nodes, rid
of a bad node (its Auto Scaling group replaces it, or it is stopped when `stallwatch:min-nodes` allows), or stopped
as without recovery when it cannot be recovered, with the reason in Slack and the audit; duplicates restart once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from handlers import on_alarm, on_job_state, sweeper
from localrun import moto_ec2, moto_ssm
from localrun.gpu_node import Agent, GpuNode, NodeFault, NodeState
from localrun.moto_world import EXAMPLE_AMI, MINUTE, TABLE, World, alarm_event, instance_state_event, scheduled_event
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, way_back
from stallwatch.core.platforms import ec2_recovery as rules
from stallwatch.core.signals import Platform
from stallwatch.offline import cli
from tests.runtime.test_e2e_hardening import _inject
from tests.runtime.test_e2e_stalls import ENFORCE, seed_nccl_hang

JOB = "llm-70b"
RECOVER = {"stallwatch:job": JOB, "stallwatch:mode": "enforce", "stallwatch:recover": "restart"}
KEY = job_key("ec2", JOB)


pytestmark = pytest.mark.slow


@pytest.fixture
def nodes() -> dict[str, GpuNode]:
    """The simulated GPU nodes the SSM documents run on, by instance id (filled by `_cluster`)."""
    return {}


def _cluster(
    rt, world: World, context, nodes: dict[str, GpuNode], tmp: Path, faults: list[NodeFault], **tags
) -> list[str]:
    """Running, tagged p4d nodes of one job, each a managed node with `faults[i]`, their alarms in place, hung:
    steps stopped 40 minutes ago (at step 70) while the GPUs stay pinned and their power falls."""
    instances = world.launch(len(faults), RECOVER | tags)
    for instance, fault in zip(instances, faults, strict=True):
        nodes[instance] = GpuNode(tmp / instance, fault)
        moto_ssm.manage(instance, nodes[instance])
    for instance in instances:
        on_job_state.handler(instance_state_event(instance, "running"), context)
    _seed_hang(world, instances)
    return instances


def _seed_hang(world: World, instances: list[str], logs: bool = True) -> None:
    world.steps_until(JOB, last_step_min=40)
    for instance in instances:
        world.ec2_gpu(instance, world.every_minute(110, 100.0))
        world.agent_host(JOB, instance, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))
        if logs:
            world.ec2_logs(instance, [(m, f"step {110 - m} loss 2.31") for m in range(110, 39, -5)])


def _stop_decision(rt, context) -> dict[str, Any]:
    """The progress alarm warns; after the grace period the sweeper decides to stop: the recovery starts."""
    warned = on_alarm.handler(
        alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "ec2", JOB, alarms.PROGRESS)), context
    )
    assert warned["action"] == "warn", warned
    rt.clock.advance(6 * MINUTE)
    (decided,) = sweeper.handler(scheduled_event(), context)["redecided"]
    return decided


def _sweep(rt, context, minutes: float = 5) -> dict[str, Any]:
    rt.clock.advance(minutes * MINUTE)
    return sweeper.handler(scheduled_event(), context)


def _record_calls(client: Any, operation: str) -> list[dict[str, Any]]:
    """Every `operation` call's parameters, as the functions send them."""
    calls: list[dict[str, Any]] = []
    service = client.meta.service_model.service_id.hyphenize()
    client.meta.events.register(
        f"provide-client-params.{service}.{operation}", lambda params, **_: calls.append(params)
    )
    return calls


def _steps_after(world: World, t0: float, first_step: float, count: int = 5) -> None:
    """The restarted training's steps, from its checkpoint: one each 30 s from `t0` on."""
    world.agent_job(JOB, "Step", [(t0 + 30 * k, first_step + k) for k in range(1, count + 1)])
    world.agent_job(JOB, "Steps", [(t0 + 30 * k, 1.0) for k in range(1, count + 1)])


def _recover_records(rt) -> list[dict[str, Any]]:
    return [r for r in rt.audit.records(KEY, "audit") if r["record"]["action"] == way_back.RECOVER_ACTION]


def test_a_hung_cluster_whose_nodes_pass_is_restarted_in_place_and_slack_hears_the_first_step(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung 2-node cluster that opted in to recovery in place, both nodes healthy
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE, NodeFault.NONE])
    stops = _record_calls(rt.clients.ec2, "StopInstances")
    sends = _record_calls(rt.clients.ssm, "SendCommand")

    # When the engine decides to stop it
    decided = _stop_decision(rt, context)

    # Then it is not stopped: the health check goes to both nodes, and Slack hears why it is recovering
    assert (decided["action"], decided["details"]["recovery"]["status"]) == ("stop", "checking")
    assert "stopped" not in decided
    assert [s["DocumentName"] for s in sends] == ["stallwatch-health-check"]
    assert sorted(sends[0]["InstanceIds"]) == instances
    assert "recovering in place instead of stopping (restart 1 of 3)" in slack.texts()[-1]
    assert "no completed step" in slack.texts()[-1]

    # When the sweeper reads the nodes' answers
    summary = _sweep(rt, context)

    # Then both passed, and the training is restarted in place on both, once
    (restarted,) = summary["recoveries"]
    assert (restarted["status"], restarted["nodes"]) == ("restarted", 2)
    assert [n.restarts for n in nodes.values()] == [1, 1]
    assert slack.texts()[-1].endswith(
        "2 of 2 nodes passed the health check; restarting the training in place (`stallwatch-train.service`)"
    )

    # When the restarted training, its checkpoint (step 60) loaded in 5 minutes, steps again, and the sweeper looks
    restart_t = restarted["restarted_at"]
    assert _sweep(rt, context, minutes=4)["recoveries"][0]["status"] == "watching"
    _steps_after(world, restart_t + 5 * MINUTE, first_step=60)
    (watched,) = _sweep(rt, context, minutes=3)["recoveries"]

    # Then Slack hears by when the first new step came (within the minute it was in), the engine watches the job
    # anew, and nothing was stopped
    assert (watched["status"], watched["step"]) == ("progressed", 61.0)
    assert 5 * MINUTE + 30 < watched["seconds_after_restart"] <= 5 * MINUTE + 30 + MINUTE
    assert slack.texts()[-1].endswith("training again after the restart in place: step 61 within 6 min of the restart")
    assert stops == []
    assert all(world.instance_state(i) == "running" for i in instances)
    assert rt.states.load(KEY).state.stopped_at is None
    assert [n.restarts for n in nodes.values()] == [1, 1]
    assert _sweep(rt, context)["recoveries"] == []
    # ...and each step is audited
    phases = [r["record"]["phase"] for r in _recover_records(rt)]
    assert phases == ["checking", "restarted", "progress"]


def test_a_hung_trainium_cluster_whose_nodes_pass_the_neuron_checks_is_restarted_in_place(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung 2-node trn1.32xlarge cluster that opted in: healthy Trainium nodes, whose agents saw the NeuronCores
    # pinned and their power fallen
    instances = world.launch(2, RECOVER, instance_type="trn1.32xlarge")
    for instance in instances:
        nodes[instance] = GpuNode(tmp_path / instance, state=NodeState.trn1())
        moto_ssm.manage(instance, nodes[instance])
        on_job_state.handler(instance_state_event(instance, "running"), context)
    world.steps_until(JOB, last_step_min=40)
    for instance in instances:
        world.agent_host(JOB, instance, "AcceleratorUtilization", world.every_minute(110, 100.0))
        world.agent_host(
            JOB, instance, "AcceleratorPowerPercent", world.every_minute(110, lambda m: 60 if m > 40 else 15)
        )

    # When the engine decides to stop it and the sweeper reads the nodes' health checks
    decided = _stop_decision(rt, context)
    (restarted,) = _sweep(rt, context)["recoveries"]

    # Then both nodes passed the Neuron checks (no "no nvidia-smi"), and the training restarts in place on both
    assert (decided["action"], decided["details"]["recovery"]["status"]) == ("stop", "checking")
    assert (restarted["status"], restarted["nodes"]) == ("restarted", 2)
    assert [n.restarts for n in nodes.values()] == [1, 1]
    assert "2 of 2 nodes passed the health check" in slack.texts()[-1]


def _group(rt, count: int, tags: dict[str, str]) -> list[str]:
    """An Auto Scaling group of `count` p4d nodes that propagates `tags` to them, as a training cluster's group does."""
    ec2, autoscaling = rt.clients.ec2, rt.clients.autoscaling
    ec2.create_launch_template(
        LaunchTemplateName="train", LaunchTemplateData={"ImageId": EXAMPLE_AMI, "InstanceType": "p4d.24xlarge"}
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="train-asg",
        LaunchTemplate={"LaunchTemplateName": "train", "Version": "$Latest"},
        MinSize=count,
        MaxSize=count,
        DesiredCapacity=count,
        AvailabilityZones=["us-east-1a"],
        Tags=[
            {
                "Key": k,
                "Value": v,
                "PropagateAtLaunch": True,
                "ResourceId": "train-asg",
                "ResourceType": "auto-scaling-group",
            }
            for k, v in tags.items()
        ],
    )
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["train-asg"])["AutoScalingGroups"][0]
    return sorted(i["InstanceId"] for i in group["Instances"])


def _running(world: World) -> list[str]:
    reservations = world.clients.ec2.describe_instances(
        Filters=[
            {"Name": "tag:stallwatch:job", "Values": [JOB]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
    )["Reservations"]
    return sorted(i["InstanceId"] for r in reservations for i in r["Instances"])


def test_a_node_with_an_xid_in_an_auto_scaling_group_is_replaced_and_the_training_restarts_with_its_replacement(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung 2-node cluster in an Auto Scaling group, whose second node's kernel logged Xid 79
    instances = _group(rt, 2, RECOVER)
    healthy, bad = instances
    for instance, fault in ((healthy, NodeFault.NONE), (bad, NodeFault.XID)):
        nodes[instance] = GpuNode(tmp_path / instance, fault)
        moto_ssm.manage(instance, nodes[instance])
    moto_ssm.manage_new(lambda instance: nodes.setdefault(instance, GpuNode(tmp_path / instance)))  # boots healthy
    for instance in instances:
        on_job_state.handler(instance_state_event(instance, "running"), context)
    _seed_hang(world, instances)
    stops = _record_calls(rt.clients.ec2, "StopInstances")
    health = _record_calls(rt.clients.autoscaling, "SetInstanceHealth")

    # When the stop decision's health check is read
    assert _stop_decision(rt, context)["details"]["recovery"]["status"] == "checking"
    (taken_out,) = _sweep(rt, context)["recoveries"]

    # Then the bad node is marked unhealthy (now, not after a grace period), Slack names it and why
    assert (taken_out["status"], taken_out["bad"]) == ("replacing", [bad])
    assert health == [{"InstanceId": bad, "HealthStatus": "Unhealthy", "ShouldRespectGracePeriod": False}]
    assert f"{bad} failed its health check (Xid 79: GPU has fallen off the bus)" in slack.texts()[-1]
    assert "marked unhealthy in Auto Scaling group `train-asg`" in slack.texts()[-1]
    assert [n.restarts for n in nodes.values()] == [0, 0]

    # When the sweeper sees the group's replacement running
    (restarted,) = _sweep(rt, context)["recoveries"]

    # Then the training restarts on the healthy node and the replacement, once; nothing was stopped
    (replacement,) = set(_running(world)) - {healthy}
    assert replacement != bad
    assert (restarted["status"], restarted["nodes"]) == ("restarted", 2)
    assert (nodes[healthy].restarts, nodes[bad].restarts, nodes[replacement].restarts) == (1, 0, 1)
    assert f"{replacement} joined; restarting the training in place on 2 nodes" in slack.texts()[-1]
    assert world.instance_state(bad) == "terminated"
    assert stops == []


def test_a_bad_node_outside_a_group_is_stopped_and_the_others_restart_when_min_nodes_allows(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung 3-node cluster without a group, which can train on 2 nodes; one node has an uncorrectable ECC error
    faults = [NodeFault.NONE, NodeFault.ECC, NodeFault.NONE]
    instances = _cluster(rt, world, context, nodes, tmp_path, faults, **{"stallwatch:min-nodes": "2"})
    bad = next(i for i in instances if nodes[i].state.ecc_uncorrectable)
    stops = _record_calls(rt.clients.ec2, "StopInstances")

    # When the health check is read
    _stop_decision(rt, context)
    (restarted,) = _sweep(rt, context)["recoveries"]

    # Then that node alone is stopped, and the training restarts in place on the two others
    assert [call["InstanceIds"] for call in stops] == [[bad]]
    assert (restarted["status"], restarted["nodes"]) == ("restarted", 2)
    assert {i: nodes[i].restarts for i in instances} == {i: 0 if i == bad else 1 for i in instances}
    text = slack.texts()[-1]
    assert f"{bad} failed its health check (2 uncorrectable ECC errors)" in text
    assert f"stopped {bad}; restarting the training in place on the 2 others" in text
    assert world.instance_state(bad) in ("stopping", "stopped")
    assert len(_running(world)) == 2


def test_a_bad_node_the_job_cannot_lose_stops_the_job_as_today_and_slack_names_it(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung 2-node cluster without a group or a min-nodes tag; one node's kernel logged Xid 79
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.XID, NodeFault.NONE])
    bad = next(i for i in instances if nodes[i].state.xid_lines)
    stops = _record_calls(rt.clients.ec2, "StopInstances")

    # When the health check is read
    _stop_decision(rt, context)
    (fell_back,) = _sweep(rt, context)["recoveries"]

    # Then the job is stopped as without recovery (one StopInstances for all), nothing restarted, and Slack says why
    assert (fell_back["status"], fell_back["stopped"]) == ("stopped", True)
    assert [sorted(call["InstanceIds"]) for call in stops] == [instances]
    assert [n.restarts for n in nodes.values()] == [0, 0]
    text = slack.texts()[-1]
    assert f"cannot recover in place: {bad} failed its health check (Xid 79: GPU has fallen off the bus)" in text
    assert "the job does not allow fewer nodes (no stallwatch:min-nodes tag)" in text
    assert text.endswith("stopped the job instead (2 of 2 instances stopping)")
    # ...and it is Stallwatch's stop in the audit trail, with its reason (what the resume and the report read)
    (stop,) = rt.audit.stops(KEY)
    assert (stop.diagnosis, stop.step, stop.ok) == ("hang", 70.0, True)
    stop_record = [r for r in rt.audit.records(KEY, "audit") if r["record"].get("trigger") == "recovery"][-1]
    assert stop_record["record"]["reasons"][0].startswith(f"recovery in place: {bad} failed its health check")
    assert stop_record["record"]["checks"][bad]["failures"] == ["Xid 79: GPU has fallen off the bus"]


def test_an_instance_ssm_does_not_manage_is_stopped_at_once_with_the_reason_in_slack_and_the_audit(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung cluster one of whose nodes SSM does not manage (no agent registered)
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE, NodeFault.NONE])
    moto_ssm.reset()
    moto_ssm.manage(instances[0], nodes[instances[0]])

    # When the engine decides to stop it
    decided = _stop_decision(rt, context)

    # Then SSM refuses the health check, and the job is stopped in the same decision, Slack and the audit saying why
    assert decided["stopped"] is True
    recovery = decided["details"]["recovery"]
    assert recovery["status"] == "not_recovered"
    assert "the health check could not be delivered" in recovery["reason"]
    assert "InvalidInstanceId" in recovery["reason"]
    assert all(world.instance_state(i) in ("stopping", "stopped") for i in instances)
    stop_message = slack.posts[-1]
    assert "Stopped stalled job" in stop_message["text"]
    assert "not recovered in place: the health check could not be delivered" in str(stop_message["blocks"])
    assert rt.audit.stops(KEY)[-1].ok is True
    assert _sweep(rt, context)["recoveries"] == []


def test_an_agent_that_cannot_be_reached_makes_the_job_fall_back_to_stop(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung cluster whose second node's agent no longer answers (its invocation is Undeliverable)
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE, NodeFault.NONE])
    nodes[instances[1]].agent = Agent.OFFLINE

    # When the health check is read
    _stop_decision(rt, context)
    (fell_back,) = _sweep(rt, context)["recoveries"]

    # Then the job is stopped, and Slack names the node SSM could not reach
    assert (fell_back["status"], fell_back["stopped"]) == ("stopped", True)
    assert all(world.instance_state(i) in ("stopping", "stopped") for i in instances)
    assert f"the health check could not be delivered to {instances[1]} (Failed: Undeliverable)" in slack.texts()[-1]
    assert [n.restarts for n in nodes.values()] == [0, 0]


def test_a_health_check_that_never_finishes_is_that_nodes_failure(rt, world, slack, context, nodes, tmp_path) -> None:
    # Given a hung 3-node cluster that can train on 2, whose last node hangs in its health check
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE] * 3, **{"stallwatch:min-nodes": "2"})
    nodes[instances[2]].agent = Agent.UNRESPONSIVE
    _stop_decision(rt, context)

    # When the sweeper reads the answers before the wait is over, Then it waits for that node
    (waiting,) = _sweep(rt, context)["recoveries"]
    assert (waiting["status"], waiting["waiting_for"]) == ("checking", [instances[2]])
    assert [n.restarts for n in nodes.values()] == [0, 0, 0]

    # When the wait is over
    (restarted,) = _sweep(rt, context, minutes=rules.HEALTH_CHECK_WAIT_S / 60)["recoveries"]

    # Then the node that never answered counts as failed (not the control plane): it is stopped, the others restart
    assert (restarted["status"], restarted["nodes"]) == ("restarted", 2)
    assert world.instance_state(instances[2]) in ("stopping", "stopped")
    assert f"{instances[2]} failed its health check (timed out)" in slack.texts()[-1]
    assert [n.restarts for n in nodes.values()] == [1, 1, 0]


def test_overlapping_sweeps_and_repeated_stop_decisions_restart_once(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung cluster whose recovery's health check was sent
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE, NodeFault.NONE])
    _stop_decision(rt, context)
    sends = _record_calls(rt.clients.ssm, "SendCommand")

    # When a second sweeper run starts while the first is sending the restart
    overlapping: list[dict[str, Any]] = []

    def second_sweep(params: dict[str, Any], **kwargs: Any) -> None:
        if params["DocumentName"] == "stallwatch-restart-training" and not overlapping:
            overlapping.append(sweeper.handler(scheduled_event(), context))

    rt.clients.ssm.meta.events.register("provide-client-params.ssm.SendCommand", second_sweep)
    (first,) = _sweep(rt, context)["recoveries"]

    # Then the second found the step held, and the training was restarted once on each node
    assert overlapping[0]["recoveries"] == [{"job": JOB, "status": "held"}]
    assert first["status"] == "restarted"
    assert [s["DocumentName"] for s in sends] == ["stallwatch-restart-training"]
    assert [n.restarts for n in nodes.values()] == [1, 1]

    # When the engine decides to stop the same stall again (a decision whose Lambda died was decided again)
    key_state = rt.states.load(KEY)
    assert key_state.state.stopped_at is not None
    rt.states.release_stop(KEY, key_state.state, key_state.version)
    (again,) = _sweep(rt, context)["redecided"]

    # Then its recovery is found under way: nothing more is sent, nothing stopped
    assert again["details"]["recovery"] == {"status": "duplicate"}
    assert "stopped" not in again
    assert [s["DocumentName"] for s in sends] == ["stallwatch-restart-training"]
    assert all(world.instance_state(i) == "running" for i in instances)


def test_a_restart_that_brings_no_step_is_stopped_after_the_startup_grace(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung cluster restarted in place, whose training never steps again
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE, NodeFault.NONE])
    _stop_decision(rt, context)
    assert _sweep(rt, context)["recoveries"][0]["status"] == "restarted"

    # When the job's startup grace (60 min) passes without a step
    assert _sweep(rt, context, minutes=30)["recoveries"][0]["status"] == "watching"
    (fell_back,) = _sweep(rt, context, minutes=31)["recoveries"]

    # Then it is stopped as without recovery, and Slack says why
    assert (fell_back["status"], fell_back["stopped"]) == ("stopped", True)
    assert "cannot recover in place: no step within 60 min of the restart" in slack.texts()[-1]
    assert all(world.instance_state(i) in ("stopping", "stopped") for i in instances)


def _restarted_then_hung_again(
    rt, world, context, nodes, tmp_path, budget: str, next_stall_step: float
) -> dict[str, Any]:
    """A one-node cluster allowed `budget` restarts, hung at step 70, restarted in place (it steps again from 60),
    then, an hour on, hung again at `next_stall_step`: the decision on that second stall."""
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE], **{"stallwatch:resume": budget})
    _stop_decision(rt, context)
    restart_t = _sweep(rt, context)["recoveries"][0]["restarted_at"]
    _steps_after(world, restart_t + MINUTE, first_step=60)
    assert _sweep(rt, context)["recoveries"][0]["status"] == "progressed"
    rt.clock.advance(60 * MINUTE)
    world.now = rt.clock()
    base = next_stall_step - 70
    world.agent_job(JOB, "Step", world.every_minute(50, lambda m: base + 110 - max(m, 40)))
    world.agent_job(JOB, "Steps", world.every_minute(50, lambda m: 1.0 if m > 40 else 0.0))
    world.agent_job(JOB, "LastStepAge", world.every_minute(50, lambda m: 0.0 if m > 40 else (40 - m) * MINUTE))
    _seed_hang(world, instances, logs=False)
    (warned,) = sweeper.handler(scheduled_event(), context)["redecided"]
    assert (warned["diagnosis"], warned["action"]) == ("hang", "warn")
    (again,) = _sweep(rt, context, minutes=6)["redecided"]
    return again


def test_the_restart_budget_applies_as_for_resume(rt, world, slack, context, nodes, tmp_path) -> None:
    # Given a cluster allowed one restart, restarted in place, that trains on and hangs again further on (step 110)
    again = _restarted_then_hung_again(rt, world, context, nodes, tmp_path, budget="1", next_stall_step=110)

    # Then it is stopped as without recovery: its restart is spent, and the stop message says so
    assert (again["action"], again["stopped"]) == ("stop", True)
    assert again["details"]["recovery"]["reason"] == "gave up: restart budget spent (1 of 1 restarts)"
    assert "not recovered in place: gave up: restart budget spent (1 of 1 restarts)" in str(slack.posts[-1]["blocks"])
    assert [n.restarts for n in nodes.values()] == [1]


def test_a_restart_without_progress_gives_up_as_for_resume(rt, world, slack, context, nodes, tmp_path) -> None:
    # Given a cluster allowed two restarts, restarted in place at step 70, that hangs again at step 65
    again = _restarted_then_hung_again(rt, world, context, nodes, tmp_path, budget="2", next_stall_step=65)

    # Then it is stopped: no progress since its restart
    assert (again["action"], again["stopped"]) == ("stop", True)
    assert again["details"]["recovery"]["reason"] == "gave up: no progress after 1 restart"
    assert [n.restarts for n in nodes.values()] == [1]


def test_progress_since_the_restart_allows_the_next_restart_in_place(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a cluster allowed two restarts, restarted in place at step 70, that hangs again further on (step 110)
    again = _restarted_then_hung_again(rt, world, context, nodes, tmp_path, budget="2", next_stall_step=110)

    # Then the second stall is recovered in place too, as restart 2 of 2
    assert again["details"]["recovery"]["status"] == "checking"
    assert "stopped" not in again
    assert "recovering in place instead of stopping (restart 2 of 2)" in slack.texts()[-1]


# The known split of a run recovered in place (minutes from the hang's alarm, c0): launched at -120, steps from -110
# to -40 (0 -> 70), hung from -40; the stop decision at +6 sends the health check, the next sweep (+11) restarts the
# training in place; 5 min of startup (the checkpoint at step 50), steps from +16 to +46 (51..70 redone, 71..80 new);
# the launch script stops the nodes at +48. A restart in place keeps the instances: no gap, every minute billed.
IN_PLACE_MINUTES = {
    "productive": 70 + 10,
    "redone": 20,
    "startup": 10 + 5,
    "phases": 0,
    "stalls": 40 + 11,
    "restart_gaps": 0,
    "other": 2,
}
IN_PLACE_WALL_MINUTES = 168


def test_a_restart_in_place_is_an_attempt_of_the_run_in_the_goodput_report(
    rt, context, nodes, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the known run above, through the functions
    rt.clock.now = c0 = float(int(rt.clock() // MINUTE) * MINUTE)  # metric periods fall on whole minutes
    world = World(rt.clients, now=c0)
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE, NodeFault.NONE])
    moto_ec2.set_instance_times(instances, launched=c0 - 120 * MINUTE)
    assert _stop_decision(rt, context)["details"]["recovery"]["status"] == "checking"
    (restarted,) = _sweep(rt, context)["recoveries"]
    assert restarted["restarted_at"] == c0 + 11 * MINUTE
    steps = [c0 + (16 + k) * MINUTE for k in range(30)]
    world.agent_job(JOB, "Steps", [(t, 1.0) for t in steps])
    world.agent_job(JOB, "Step", [(t, 51.0 + k) for k, t in enumerate(steps)])
    assert _sweep(rt, context, minutes=9)["recoveries"][0]["status"] == "progressed"
    rt.clock.now = c0 + 48 * MINUTE
    rt.clients.ec2.stop_instances(InstanceIds=instances)
    moto_ec2.set_instance_times(instances, stopped=rt.clock())

    # When `stallwatch report` reads it back (what the functions printed before it, their metrics, set aside)
    capsys.readouterr()
    assert cli.main(["report", JOB, "--platform", "ec2", "--table", TABLE, "--json", "--period", "60"]) == 0
    report = json.loads(capsys.readouterr().out)

    # Then the restart in place is the run's second attempt: the stall ends at the restart, with no gap
    assert report["jobs"] == [JOB, f"{JOB} (restart 1)"]
    assert {c: round(t["seconds"]) for c, t in report["categories"].items()} == {
        c: m * 60 for c, m in IN_PLACE_MINUTES.items()
    }
    assert report["wall_s"] == IN_PLACE_WALL_MINUTES * 60
    assert (report["restarts"], report["stalls_caught"], report["redone_steps"], report["final_step"]) == (1, 1, 20, 80)
    assert report["gpu_hours"] == pytest.approx(IN_PLACE_WALL_MINUTES / 60 * 2 * 8)


def test_a_fallback_stop_that_fails_is_given_back_to_the_engine_which_stops_the_job(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung cluster that cannot lose its bad node, whose fallback StopInstances EC2 refuses (all 3 calls: the
    # job's, then each instance's)
    instances = _cluster(rt, world, context, nodes, tmp_path, [NodeFault.XID, NodeFault.NONE])
    _stop_decision(rt, context)
    _inject(rt.clients.ec2, "StopInstances", "UnauthorizedOperation", times=3)

    # When the health check is read and the job falls back to a stop
    (fell_back,) = _sweep(rt, context)["recoveries"]

    # Then the failure is said, and the engine has the stop again (its stop decision no longer stands)
    assert (fell_back["status"], fell_back["stopped"]) == ("stopped", False)
    assert "stopped the job instead (stop FAILED, will retry" in slack.texts()[-1]
    assert rt.states.load(KEY).state.stopped_at is None
    assert all(world.instance_state(i) == "running" for i in instances)

    # When the sweeper decides the job again: it is stopped as any stop, without a second recovery
    (again,) = _sweep(rt, context)["redecided"]
    assert (again["action"], again["stopped"]) == ("stop", True)
    assert again["details"]["recovery"]["reason"] == "its recovery in place fell back to a stop before"
    assert all(world.instance_state(i) in ("stopping", "stopped") for i in instances)
    assert [n.restarts for n in nodes.values()] == [0, 0]


# ---- the walk of one alarm: each platform's way back behind its adapter --------------------------------------------


def _modules_called(run: Any) -> set[str]:
    """The modules whose functions `run()` calls, as the profiler sees them."""
    seen: set[str] = set()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            seen.add(frame.f_globals.get("__name__", ""))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def _other_platforms_modules(seen: set[str], platform: str) -> list[str]:
    """The modules of `seen` that are another platform's (its description's, adapter's or way back's own)."""
    others = [p.value for p in Platform if p.value != platform]
    return sorted(m for m in seen if ".platforms." in m and m.rsplit(".", 1)[1].startswith(tuple(others)))


def test_a_sagemaker_alarms_walk_reaches_its_stop_without_visiting_another_platforms_way_back(
    rt, world, slack, context
) -> None:
    # Given a hung SageMaker job that opted in to stopping, warned
    seed_nccl_hang(world, "falcon-40b", ENFORCE)
    alarm = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", "falcon-40b", alarms.PROGRESS)
    on_alarm.handler(alarm_event(alarm), context)
    rt.clock.advance(6 * MINUTE)

    # When its next alarm stops it
    stopped: list[dict[str, Any]] = []
    seen = _modules_called(
        lambda: stopped.append(on_alarm.handler(alarm_event(alarm, "2026-11-30T10:06:00Z"), context))
    )

    # Then the walk went decide -> the generic way back -> the job's adapter's stop, and through no module of
    # another platform (EC2's restart in place, Slurm's requeue)
    assert (stopped[0]["action"], stopped[0]["stopped"]) == ("stop", True)
    assert {"stallwatch.runtime.decide", "stallwatch.runtime.way_back", "stallwatch.aws.platforms.sagemaker"} <= seen
    assert _other_platforms_modules(seen, "sagemaker") == []
    assert [m for m in seen if m.startswith("stallwatch.") and ("recover" in m or "restart" in m)] == []


def test_an_ec2_restart_in_places_walk_visits_no_other_platforms_module(
    rt, world, slack, context, nodes, tmp_path
) -> None:
    # Given a hung cluster that opted in to recovery in place, both nodes healthy, warned
    _cluster(rt, world, context, nodes, tmp_path, [NodeFault.NONE, NodeFault.NONE])
    alarm = alarms.alarm_name(rt.config.alarm_prefix, "ec2", JOB, alarms.PROGRESS)
    on_alarm.handler(alarm_event(alarm), context)
    rt.clock.advance(6 * MINUTE)
    # When its next alarm decides the stop, Then its recovery starts through EC2's adapter, and no module of another
    # platform is called
    decided: list[dict[str, Any]] = []
    seen = _modules_called(
        lambda: decided.append(on_alarm.handler(alarm_event(alarm, "2026-11-30T10:06:00Z"), context))
    )
    assert decided[0]["details"]["recovery"]["status"] == "checking"
    assert "stallwatch.aws.platforms.ec2_restart" in seen
    assert _other_platforms_modules(seen, "ec2") == []
