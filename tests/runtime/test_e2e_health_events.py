"""End to end on moto: AWS Health's scheduled events for the instances of running jobs. The real handler gets the
corpus's real-shaped event (corpus/aws_events/health/) for one of a job's instances: the job hears the instance, the
event, the window and its last checkpoint's age on Slack, once, and `stallwatch status` shows it; a job opted in is
moved off the instance before the window, at a quiet moment (right after a checkpoint): an EC2 cluster restarted in
place without the node (recovery in place's take-out and restart, on simulated GPU nodes), a Slurm job requeued with
the node drained on its controller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handlers import on_health_event, on_job_state, sweeper
from localrun import moto_ssm
from localrun.gpu_node import GpuNode
from localrun.moto_world import MINUTE, TABLE, World, instance_state_event, scheduled_event
from stallwatch.aws.events import InvalidEventError
from stallwatch.aws.host_events import HostEvents
from stallwatch.aws.store import job_key
from stallwatch.core import health_events as rules
from stallwatch.core.config import EC2_LOG_GROUP, StallwatchConfig
from stallwatch.core.platforms.ec2_recovery import MOVED_OFF
from stallwatch.core.platforms.slurm import slurm_job_name
from stallwatch.offline import cli
from tests.fixtures.health import ISSUE, RETIREMENT, health_event, load
from tests.fixtures.slurm import FakeRunner, parallelcluster, slurm_event

JOB = "llm-70b"
KEY = job_key("ec2", JOB)
HOUR = 3600.0
ENFORCE = {"stallwatch:job": JOB, "stallwatch:mode": "enforce"}
RECOVER = ENFORCE | {"stallwatch:recover": "restart", "stallwatch:min-nodes": "2"}
CHECKPOINT_END = "Saving checkpoint took 41.2 seconds"  # torchtune's line (corpus/real_lines), a checkpoint's end


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")


def _training(rt, world: World, context, count: int, tags: dict[str, str], checkpoint_min: float = 30) -> list[str]:
    """`count` running p4d nodes of one job, training: a step a minute from 110 minutes ago until a quarter of an hour
    from now, GPUs busy, each node's log stepping, its last checkpoint ended `checkpoint_min` minutes ago."""
    instances = world.launch(count, tags)
    for instance in instances:
        on_job_state.handler(instance_state_event(instance, "running"), context)
    world.steps_until(JOB, last_step_min=-15)
    for instance in instances:
        world.ec2_gpu(instance, world.every_minute(110, 100.0))
        world.agent_host(JOB, instance, "GPUPowerWatts", world.every_minute(110, 390.0))
        lines = [(m, f"step {110 - m} loss 2.31") for m in range(110, 0, -5)]
        world.ec2_logs(instance, sorted([*lines, (checkpoint_min, CHECKPOINT_END)], reverse=True))
    return instances


def _log_now(rt, instance: str, message: str) -> None:
    """A line on the node's stream at the runtime's clock (the CloudWatch agent shipping it)."""
    event = {"timestamp": int(rt.clock() * 1000), "message": message}
    rt.clients.logs.put_log_events(logGroupName=EC2_LOG_GROUP, logStreamName=instance, logEvents=[event])


def _sweep(rt, context, minutes: float) -> dict[str, Any]:
    rt.clock.advance(minutes * MINUTE)
    return sweeper.handler(scheduled_event(), context)


def test_a_retirement_of_a_running_jobs_instance_is_posted_once_and_shown_by_status(
    rt, world, slack, context, capsys
) -> None:
    # Given a 2-node EC2 job training, its last checkpoint 30 minutes ago, not opted in to moves
    instances = _training(rt, world, context, 2, ENFORCE)
    now = rt.clock()
    start = now + 10 * 86_400

    # When AWS Health schedules the retirement of its second instance, and the event is delivered twice
    event = health_event(instances[1], start=start, end=start + 2 * HOUR)
    first = on_health_event.handler(event, context)
    again = on_health_event.handler(event, context)

    # Then Slack hears it once: the instance, the event, the window, the checkpoint's age, and how to opt in
    assert [j["status"] for j in first["jobs"]] == [rules.TOLD]
    assert [j["status"] for j in again["jobs"]] == ["duplicate"]
    [text] = [t for t in slack.texts() if RETIREMENT in t]
    assert f"`{JOB}`: AWS Health scheduled the retirement of {instances[1]} ({RETIREMENT})" in text
    assert f"window {rules.when(start)} to {rules.when(start + 2 * HOUR)} (in 10.0 days)" in text
    assert "last checkpoint: 30 min ago (its end line)" in text
    assert "tag it stallwatch:mode=enforce and stallwatch:recover=restart to move it before the window" in text
    [audit] = [r["record"] for r in rt.audit.records(KEY, "audit") if r["record"]["action"] == rules.NOTICE_ACTION]
    assert (audit["instance"], audit["code"], audit["state"]) == (instances[1], RETIREMENT, rules.TOLD)

    # And `stallwatch status` shows a line for it
    assert cli.main(["status", JOB, "--platform", "ec2", "--table", TABLE]) == 0
    out = capsys.readouterr().out
    assert f"host event: {instances[1]} {RETIREMENT}, window {rules.when(start)}" in out
    assert "not moved (not opted in)" in out


def test_the_events_words_are_escaped_in_slack(rt, world, slack, context) -> None:
    # Given a job, and an event whose description holds Slack's control characters
    instances = _training(rt, world, context, 1, ENFORCE)
    words = "Retire <!channel> & see <https://evil.example|the console>"

    # When it is delivered
    on_health_event.handler(health_event(instances[0], start=rt.clock() + 86_400, description=words), context)

    # Then they reach Slack as text, not as a mention or a link
    text = slack.texts()[-1]
    assert "Retire &lt;!channel&gt; &amp; see &lt;https://evil.example|the console&gt;" in text
    assert "<!channel>" not in text


def test_a_malformed_event_changes_nothing_and_another_kind_of_event_is_ignored(rt, world, slack, context) -> None:
    instances = _training(rt, world, context, 1, ENFORCE)
    bad = health_event(instances[0], start=rt.clock() + 86_400)
    bad["detail"]["eventArn"] = "not an arn"
    with pytest.raises(InvalidEventError, match="eventArn"):
        on_health_event.handler(bad, context)
    issue = load(ISSUE)  # the corpus's EC2 issue (a degraded drive), not a scheduled change
    assert on_health_event.handler(issue, context)["status"] == "ignored"
    assert slack.texts() == []
    assert HostEvents(rt.store).notices(KEY) == []


def test_an_opted_in_cluster_is_restarted_in_place_without_the_instance_right_after_a_checkpoint(
    rt, world, slack, context, tmp_path: Path
) -> None:
    # Given a 3-node EC2 job opted in to recovery (it may train on 2 nodes), each node a simulated GPU node under SSM
    instances = _training(rt, world, context, 3, RECOVER)
    nodes = {instance: GpuNode(tmp_path / instance) for instance in instances}
    for instance, node in nodes.items():
        moto_ssm.manage(instance, node)
    leaving = instances[1]
    start = rt.clock() + 3 * HOUR

    # When AWS Health schedules the reboot of one of its instances in three hours
    told = on_health_event.handler(
        health_event(leaving, start=start, code="AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED"), context
    )

    # Then the move is planned, and Slack says when it will be made at the latest
    assert [j["status"] for j in told["jobs"]] == [rules.PLANNED]
    assert "restarted in place without it right after its next checkpoint" in slack.texts()[-1]

    # When the sweeper looks before a new checkpoint, Then it waits
    assert [m["status"] for m in _sweep(rt, context, 2)["host_moves"]] == ["waiting"]

    # When a checkpoint ends and the sweeper looks again
    _log_now(rt, instances[0], CHECKPOINT_END)
    moved = _sweep(rt, context, 3)["host_moves"]

    # Then the instance is taken out (stopped: no group, the job allows 2 nodes) before the window, and the training
    # restarts in place on the two others, once
    assert [(m["status"], m["why"]) for m in moved] == [("restarted", "a checkpoint ended 3 min ago")]
    assert rt.clock() < start - rules.MOVE_LEAD_S
    assert world.instance_state(leaving) in ("stopping", "stopped")
    assert {i: n.restarts for i, n in nodes.items()} == {i: 0 if i == leaving else 1 for i in instances}
    assert f"{leaving} {MOVED_OFF} (reboot from {rules.when(start)}, a checkpoint ended 3 min ago)" in slack.texts()[-1]
    assert f"stopped {leaving}; restarting the training in place on the 2 others" in slack.texts()[-1]

    # When the restarted training steps again
    world.agent_job(JOB, "Step", [(rt.clock() + 90, 111.0)])
    world.agent_job(JOB, "Steps", [(rt.clock() + 90, 1.0)])
    watched = _sweep(rt, context, 4)["recoveries"]

    # Then Slack hears it, and the notice reads moved
    assert [w["status"] for w in watched] == ["progressed"]
    assert "training again after the restart in place" in slack.texts()[-1]
    [notice] = HostEvents(rt.store).notices(KEY)
    assert notice.state == rules.MOVED
    assert all(world.instance_state(i) == "running" for i in instances if i != leaving)
    assert _sweep(rt, context, 5)["host_moves"] == []


def test_a_move_the_budget_does_not_allow_is_told_and_the_job_runs_on(
    rt, world, slack, context, tmp_path: Path
) -> None:
    # Given an opted-in job whose restarts are off
    instances = _training(rt, world, context, 3, RECOVER | {"stallwatch:resume": "0"})
    on_health_event.handler(health_event(instances[0], start=rt.clock() + 50 * MINUTE), context)

    # When the move is due (the window is less than an hour away)
    moved = _sweep(rt, context, 1)["host_moves"]

    # Then nothing is stopped or restarted, and Slack hears why
    assert [m["status"] for m in moved] == [rules.NOT_MOVED]
    assert "restarts are off for this job" in slack.texts()[-1]
    assert all(world.instance_state(i) == "running" for i in instances)


def test_a_closed_event_calls_its_planned_move_off(rt, world, slack, context) -> None:
    instances = _training(rt, world, context, 3, RECOVER)
    start = rt.clock() + 5 * 86_400
    on_health_event.handler(health_event(instances[0], start=start), context)
    closed = on_health_event.handler(health_event(instances[0], start=start, status="closed"), context)
    assert [c["status"] for c in closed["called_off"]] == [rules.CANCELLED]
    assert [n.state for n in HostEvents(rt.store).notices(KEY)] == [rules.CANCELLED]
    assert _sweep(rt, context, 1)["host_moves"] == []


SLURM_JOB = slurm_job_name("pc1", "42", "llm")


def test_an_opted_in_slurm_job_is_requeued_with_the_node_drained_before_the_window(
    rt, world, slack, context, tmp_path: Path
) -> None:
    # Given a deployment watching Slurm, and a Slurm job on two ParallelCluster nodes (instances of the account), opted
    # in to requeue, and its cluster's runner
    rt.config = StallwatchConfig.model_validate({"platforms": {"slurm": {"monitor": True}}})
    cluster = parallelcluster(world)
    submit = slurm_event("started")["detail"]["submit_time"]
    runner = FakeRunner(
        tmp_path / "controller", rt.store, "pc1", {"42": {"submit": submit, "state": "RUNNING", "nodes": "node1,node2"}}
    )
    instances = [cluster.instances["node1"], cluster.instances["node2"]]
    settings = {"stallwatch:mode": "enforce", "stallwatch:recover": "requeue"}
    on_job_state.handler(
        slurm_event("started", ssm_target=cluster.target, nodes=cluster.nodes, settings=settings), context
    )

    # When AWS Health schedules the stop of node2's instance in 50 minutes, and the sweeper looks
    told = on_health_event.handler(
        health_event(instances[1], start=rt.clock() + 50 * MINUTE, code="AWS_EC2_INSTANCE_STOP_SCHEDULED"), context
    )
    assert [(j["status"], j["host"]) for j in told["jobs"]] == [(rules.PLANNED, "node2")]
    moved = _sweep(rt, context, 1)
    runner.poll()
    answered = _sweep(rt, context, 1)

    # Then the job is requeued by the runner with node2 drained, and Slack hears it, then the controller's answer
    assert [m["status"] for m in moved["host_moves"]] == [rules.MOVED]
    assert [s["detail"] for s in answered["stop_answers"]] == ["requeued (PENDING); node2 drained"]
    assert runner.world()["jobs"]["42"]["state"] == "PENDING"
    assert f"`{SLURM_JOB}`: moving off node2 before AWS's stop (the window is 49 min away)" in slack.texts()[-2]
    assert "requeued (PENDING); node2 drained" in slack.texts()[-1]
