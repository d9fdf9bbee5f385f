"""End to end on moto: Slurm jobs, known from deploy/slurm's events (kept in the table), watched by per-job alarms,
cancelled or requeued through Stallwatch's SSM documents on the controller, whose answers the sweeper reads back;
states that are not stalls are never stopped. The documents run against a controller whose squeue, scancel and
scontrol play the job (tests/e2e runs them against a real Slurm)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from handlers import on_alarm, on_job_state, on_log_line, sweeper
from localrun import moto_ssm
from localrun.moto_world import MINUTE, World, alarm_event, all_alarms, log_lines_event, scheduled_event
from localrun.resources import SLURM_CANCEL_DOCUMENT, SLURM_REQUEUE_DOCUMENT
from stallwatch.aws.pending_stops import PendingStops
from stallwatch.aws.ssm import Documents
from stallwatch.aws.store import job_key
from stallwatch.core import alarms
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms.slurm import HELD_RECHECK_S, slurm_job_name, stream_name
from stallwatch.core.signals import Platform
from tests.fixtures.slurm import FakeController, slurm_event

JOB = slurm_job_name("pc1", "42", "llm")
SLURM_LOG_GROUP = StallwatchConfig().log_group("slurm")
ENFORCE = {"stallwatch:mode": "enforce"}
CRASH = "[rank 1] RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.fixture(autouse=True)
def slurm_watched(rt) -> None:
    """A deployment that watches Slurm (`platforms.slurm.monitor`: off until a cluster is set up)."""
    rt.config = StallwatchConfig.model_validate({"platforms": {"slurm": {"monitor": True}}})


@pytest.fixture
def controller(rt, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeController:
    """The cluster's controller, an instance managed by SSM, and the deployment's Slurm documents."""
    monkeypatch.setattr(
        rt, "documents", Documents(slurm_cancel=SLURM_CANCEL_DOCUMENT, slurm_requeue=SLURM_REQUEUE_DOCUMENT)
    )
    [instance] = world.launch(1, {"stallwatch:slurm": "controller"}, instance_type="c5.xlarge")
    submit = slurm_event("started")["detail"]["submit_time"]
    jobs = {"42": {"submit": submit, "state": "RUNNING", "nodes": "node1,node2"}}
    node = FakeController(tmp_path / "controller", jobs, instance)
    moto_ssm.manage(instance, node)
    return node


def started(controller: FakeController, **changes: Any) -> dict[str, Any]:
    return slurm_event("started", ssm_target=controller.instance, **changes)


def seed_hang(world: World, crashed: str | None = None, last_words: str = CRASH, start_min: int = 110) -> None:
    """The agent (JobName <cluster>-<id>-<name>, Host = the node): steps stop 40 min ago (at step `start_min` - 40),
    GPUs stay busy while power falls; the nodes' logs (one stream per node) stop with them; `crashed` logged
    `last_words` (a CUDA error) and let its GPUs go."""
    world.steps_until(JOB, last_step_min=40, start_min=start_min)
    for node in ("node1", "node2"):
        dead = node == crashed
        util = (lambda m: 100.0 if m > 40 else 0.0) if dead else (lambda m: 100.0)
        memory = (lambda m: 80.0 if m > 40 else 0.0) if dead else (lambda m: 80.0)
        world.agent_host(JOB, node, "GPUUtilization", world.every_minute(110, util))
        world.agent_host(JOB, node, "GPUMemoryUtilization", world.every_minute(110, memory))
        world.agent_host(JOB, node, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))
        lines = [(m, f"step {110 - m} loss 2.31") for m in range(110, 39, -5)]
        world._put_logs(SLURM_LOG_GROUP, stream_name(JOB, node), lines + ([(40, last_words)] if dead else []))


def decide_until_stopped(rt, context) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's progress alarm fires (a warning), then the sweeper decides after the grace: its decision, and the
    stop answers it read (moto's SSM answers at once; on AWS, a later sweep reads them)."""
    name = alarms.alarm_name(rt.config.alarm_prefix, "slurm", JOB, alarms.PROGRESS)
    fired = datetime.fromtimestamp(rt.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.000+0000")  # each its own event
    warned = on_alarm.handler(alarm_event(name, fired), context)
    assert warned.get("action") == "warn", warned
    rt.clock.advance(6 * MINUTE)
    swept = sweeper.handler(scheduled_event(), context)
    (stopped,) = swept["redecided"]
    return stopped, swept["stop_answers"]


def test_a_started_job_is_kept_with_its_nodes_instances_and_watched_by_its_alarms(
    rt, world, controller, context
) -> None:
    # Given two ParallelCluster nodes that are instances of the account, addressed as the prolog saw them
    instances = world.launch(2, {"parallelcluster:cluster-name": "pc1"})
    described = rt.clients.ec2.describe_instances(InstanceIds=instances)["Reservations"][0]["Instances"]
    addrs = {i["InstanceId"]: i["PrivateIpAddress"] for i in described}
    nodes = (("node1", addrs[instances[0]]), ("node2", addrs[instances[1]]))

    # When the job's start event arrives
    result = on_job_state.handler(started(controller, nodes=nodes, settings=ENFORCE), context)

    # Then its alarms are put under its name, reading each node's instance, and its facts are the event's
    assert (result["status"], result["job"]) == ("alarms_put", JOB)
    names = {a["AlarmName"] for a in all_alarms(rt.clients.cloudwatch)}
    assert alarms.alarm_name(rt.config.alarm_prefix, "slurm", JOB, alarms.GPU_IDLE, "node1") in names
    gpu = next(a for a in all_alarms(rt.clients.cloudwatch) if a["AlarmName"].endswith(f"{alarms.GPU_IDLE}.node1"))
    dims = [d for m in gpu["Metrics"] if "MetricStat" in m for d in m["MetricStat"]["Metric"]["Dimensions"]]
    assert dims == [{"Name": "InstanceId", "Value": instances[0]}]
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.status, facts.instance_ids, facts.instance_type) == ("InProgress", ("node1", "node2"), "p4d.24xlarge")
    assert facts.platform_ids["job_id"] == "42"
    assert JOB in rt.source(Platform.SLURM).running_jobs(rt.clock())


def test_a_hung_job_is_warned_then_cancelled_on_the_controller_and_the_answer_is_posted(
    rt, world, slack, controller, context
) -> None:
    # Given a running job tagged enforce whose steps stopped 40 minutes ago
    on_job_state.handler(started(controller, settings=ENFORCE), context)
    seed_hang(world)

    # When it is warned, then stopped after the grace, and the sweeper reads the controller's answer
    stopped, settled = decide_until_stopped(rt, context)

    # Then scancel ran on the controller for this job (its submit time matched), and Slack heard the answer
    assert (stopped["action"], stopped["stopped"]) == ("stop", True)
    assert controller.world()["jobs"]["42"]["state"] == "CANCELLED"
    assert [s["status"] for s in settled] == ["stopped"]
    assert "cancelled (CANCELLED)" in slack.texts()[-1]
    [stop] = rt.audit.stops(job_key(Platform.SLURM, JOB))
    assert stop.ok is True
    assert PendingStops(rt.store).oldest(10) == []
    assert not any(c[0] == "scontrol" and c[1] == "update" for c in controller.world()["calls"])  # no node drained

    # And when its end event arrives, its alarms go
    ended = on_job_state.handler(slurm_event("ended", job_state="CANCELLED"), context)
    assert ended["status"] == "retired"
    assert ended["alarms_deleted"] > 0
    assert not all_alarms(rt.clients.cloudwatch, AlarmNamePrefix=f"{rt.config.alarm_prefix}slurm.")


def test_a_suspended_job_is_left_alone_and_not_stopped_while_it_is(rt, world, slack, controller, context) -> None:
    # Given a job that Slurm suspended (no event says so) and looks hung
    on_job_state.handler(started(controller, settings=ENFORCE), context)
    seed_hang(world)
    controller.set_state("42", "SUSPENDED")

    # When Stallwatch stops it and reads the answer, then decides again
    _, [settled] = decide_until_stopped(rt, context)
    rt.clock.advance(HELD_RECHECK_S - 5 * MINUTE)  # within the answer's belief (the stored time is rounded to ms)
    again = on_alarm.handler(
        alarm_event(
            alarms.alarm_name(rt.config.alarm_prefix, "slurm", JOB, alarms.PROGRESS),
            timestamp="2026-11-30T11:00:00.000+0000",
        ),
        context,
    )

    # Then nothing was cancelled, Slack heard why, and the job is not stopped while suspended
    assert settled["status"] == "held"
    assert controller.world()["jobs"]["42"]["state"] == "SUSPENDED"
    assert "left alone" in slack.texts()[-1]
    assert "SUSPENDED" in slack.texts()[-1]
    assert again.get("action") in (None, "none"), again
    assert rt.source(Platform.SLURM).facts(JOB).status == "Paused"
    assert [s.ok for s in rt.audit.stops(job_key(Platform.SLURM, JOB))] == [False]  # no stop to count


def test_a_crashed_rank_requeues_the_job_without_draining_its_node_then_its_next_attempt_is_watched(
    rt, world, slack, controller, context
) -> None:
    # Given a job that opted in to requeue; node2's rank died of a CUDA error (the application's) while node1 spins
    settings = ENFORCE | {"stallwatch:recover": "requeue"}
    on_job_state.handler(started(controller, settings=settings), context)
    seed_hang(world, crashed="node2")

    # When it is stopped, and the sweeper reads the answer
    stopped, [settled] = decide_until_stopped(rt, context)

    # Then the job was requeued, not cancelled, as the run's first attempt; and no node was drained: an application
    # error says nothing about its node
    assert stopped["stopped"] is True
    assert stopped["details"]["recovery"] == {"status": "requeued", "attempt": 1, "allowed": 3, "drained": []}
    world_after = controller.world()
    assert world_after["drained"] == {}
    assert world_after["jobs"]["42"]["state"] == "PENDING"
    assert settled["status"] == "stopped"
    assert "requeue of Slurm job 42 sent" in str(slack.posts)
    assert "drained" not in str(slack.posts)

    # And the requeue's end retires the attempt without ending the run; the next attempt gets its alarms
    ended = on_job_state.handler(slurm_event("ended", job_state="REQUEUED", restarts=1, settings=settings), context)
    assert ended["status"] == "retired"
    assert "summary" not in ended
    assert rt.source(Platform.SLURM).facts(JOB).status == "Paused"
    again = on_job_state.handler(
        started(
            controller,
            settings=settings,
            restarts=1,
            submit_epoch=1_796_003_000,
            start_epoch=1_796_003_030,
            nodes=(("node1", "10.0.0.11"), ("node3", "10.0.0.13")),
        ),
        context,
    )
    assert again["status"] == "alarms_put"
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.instance_ids, facts.platform_ids["restarts"]) == (("node1", "node3"), "1")


XID = "NVRM: Xid (PCI:0000:10:1c): 79, pid=2231, name=python, GPU has fallen off the bus."


def test_a_node_whose_gpu_fell_off_the_bus_is_drained_before_the_requeue(rt, world, slack, controller, context) -> None:
    # Given a job that opted in to requeue; node2's kernel logged a hardware Xid as its rank died
    settings = ENFORCE | {"stallwatch:recover": "requeue"}
    on_job_state.handler(started(controller, settings=settings), context)
    seed_hang(world, crashed="node2", last_words=XID)

    # When it is stopped
    stopped, _ = decide_until_stopped(rt, context)

    # Then node2, which a hardware signal blames, was drained with Stallwatch's reason, and the job requeued
    assert stopped["details"]["recovery"]["drained"] == ["node2"]
    drained = controller.world()["drained"]
    assert list(drained) == ["node2"]
    assert drained["node2"].startswith("stallwatch: ")
    assert "node2 drained" in slack.texts()[-1]


def _next_attempt(
    rt, world: World, controller: FakeController, context, settings: dict[str, str], restarts: int, start_min: int
) -> None:
    """Slurm ran the requeued job again (its attempt `restarts`) hours later; the attempt crashed the same way (node2's
    rank), its steps stopping at step `start_min` - 40."""
    rt.clock.advance(3 * 3600)
    world.now = rt.clock()
    submit = int(world.now) - 130 * 60
    event = started(controller, settings=settings, restarts=restarts, submit_epoch=submit, start_epoch=submit + 30)
    state = controller.world()
    state["jobs"]["42"] = {"submit": event["detail"]["submit_time"], "state": "RUNNING", "nodes": "node1,node2"}
    controller.state.write_text(json.dumps(state))
    assert on_job_state.handler(event, context)["status"] == "alarms_put"
    seed_hang(world, crashed="node2", start_min=start_min)


def _requeue_ended(context, settings: dict[str, str], restarts: int, submit: int | None = None) -> None:
    kept = {"submit_epoch": submit, "start_epoch": submit + 30} if submit is not None else {}
    event = slurm_event("ended", job_state="REQUEUED", restarts=restarts, settings=settings, **kept)
    assert on_job_state.handler(event, context)["status"] == "retired"


@pytest.mark.parametrize(
    ("budget", "steps", "gave_up"),
    [
        ({}, (110, 110), "gave up: no progress after 1 restart"),  # the same crash at the same step: no progress
        ({"stallwatch:resume": "1"}, (110, 130), "gave up: restart budget spent (1 of 1 restarts)"),
    ],
)
def test_a_crash_looping_job_is_stopped_after_its_budget_and_no_node_is_drained_for_its_application_error(
    rt, world, slack, controller, context, budget: dict[str, str], steps: tuple[int, ...], gave_up: str
) -> None:
    # Given a job that opted in to requeue, whose rank crashes the same way on every attempt (a CUDA error)
    settings = ENFORCE | {"stallwatch:recover": "requeue"} | budget
    on_job_state.handler(started(controller, settings=settings), context)
    seed_hang(world, crashed="node2", start_min=steps[0])
    first, _ = decide_until_stopped(rt, context)
    assert first["details"]["recovery"]["status"] == "requeued"
    _requeue_ended(context, settings, restarts=1)

    # When its next attempt crashes again
    _next_attempt(rt, world, controller, context, settings, restarts=1, start_min=steps[1])
    second, _ = decide_until_stopped(rt, context)

    # Then the loop ends: the job is cancelled rather than requeued, and Slack hears why
    assert second["details"]["recovery"] == {"status": "not_recovered", "reason": gave_up}
    assert second["details"]["stop"]["detail"].startswith("scancel of Slurm job 42 sent")
    assert controller.world()["jobs"]["42"]["state"] == "CANCELLED"
    assert f"not requeued: {gave_up}" in str(slack.posts[-2])  # the stop's message (the cancel's answer follows)
    # And no node was ever drained for the application's error
    assert controller.world()["drained"] == {}
    assert [c for c in controller.world()["calls"] if c[:2] == ["scontrol", "update"]] == []


def test_a_late_start_and_a_malformed_event_change_nothing(rt, controller, context) -> None:
    on_job_state.handler(slurm_event("ended", job_state="COMPLETED"), context)
    late = on_job_state.handler(started(controller), context)
    assert late["status"] == "ignored"
    bad = started(controller)
    bad["detail"]["job_id"] = "42; reboot"
    with pytest.raises(Exception, match="job_id"):
        on_job_state.handler(bad, context)
    assert not all_alarms(rt.clients.cloudwatch)


def test_a_nodes_fatal_line_in_the_slurm_group_wakes_the_jobs_decision(rt, world, controller, context) -> None:
    # Given a running job whose node2's rank died of a CUDA error 40 minutes ago while node1 spins
    on_job_state.handler(started(controller, settings=ENFORCE), context)
    seed_hang(world, crashed="node2")

    # When the subscription delivers node2's last words from the Slurm group
    line = [(world.now - 40 * MINUTE, CRASH)]
    result = on_log_line.handler(log_lines_event(SLURM_LOG_GROUP, stream_name(JOB, "node2"), line), context)

    # Then the job is decided by the wake-up, without an alarm: its crashed rank warned
    assert (result["job"], result["status"], result["diagnosis"]) == (JOB, "decided", "crashed_rank")
    [audit, *_] = [r["record"] for r in rt.audit.records(job_key(Platform.SLURM, JOB), "audit")]
    assert audit["trigger"] == f"log:{stream_name(JOB, 'node2')}"
    # And a line of no job this deployment heard of wakes nothing
    other = stream_name(slurm_job_name("pc1", "43", "other"), "node1")
    assert on_log_line.handler(log_lines_event(SLURM_LOG_GROUP, other, line), context)["status"] == "not_found"
