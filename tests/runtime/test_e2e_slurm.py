"""End to end on moto: Slurm jobs, known from deploy/slurm's events (kept in the table) and reconciled with their
controller's view, watched by per-job alarms, cancelled or requeued by the cluster's runner through the table, whose
answers the sweeper reads back; a requeue drains only the nodes a hardware signal blames and spends the run's budget;
states that are not stalls are never stopped, a job HyperPod acts on is left to it.
The runner is deploy/slurm/stallwatch-runner's own logic over squeue, scancel and scontrol that play the job
(tests/e2e runs the runner against a real Slurm)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from corpus import real_lines
from handlers import on_alarm, on_job_state, on_log_line, sweeper
from localrun import moto_hyperpod
from localrun.moto_world import MINUTE, World, alarm_event, all_alarms, log_lines_event, scheduled_event
from stallwatch.aws.pending_stops import PendingStops
from stallwatch.aws.store import job_key
from stallwatch.core import alarms
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms.hyperpod import AGENT_STREAM_PREFIX
from stallwatch.core.platforms.slurm import HELD_RECHECK_S, log_key, slurm_job_name, stream_name
from stallwatch.core.signals import Platform
from tests.fixtures.slurm import HYPERPOD_CLUSTER, Cluster, FakeRunner, hyperpod, parallelcluster, slurm_event

JOB = slurm_job_name("pc1", "42", "llm")
SLURM_LOG_GROUP = StallwatchConfig().log_group("slurm")
ENFORCE = {"stallwatch:mode": "enforce"}
CRASH = "[rank 1] RuntimeError: CUDA error: an illegal memory access was encountered"
XID = "NVRM: Xid (PCI:0000:10:1c): 79, pid=2231, name=python, GPU has fallen off the bus."
SUBMIT = slurm_event("started")["detail"]["submit_time"]
HYPERPOD_EVENTS = Path(__file__).resolve().parents[2] / "corpus" / "aws_events" / "hyperpod"


@pytest.fixture(autouse=True)
def slurm_watched(rt) -> None:
    """A deployment that watches Slurm (`platforms.slurm.monitor`: off until a cluster is set up)."""
    rt.config = StallwatchConfig.model_validate({"platforms": {"slurm": {"monitor": True}}})


@pytest.fixture
def cluster(world: World) -> Cluster:
    return parallelcluster(world)


@pytest.fixture
def runner(rt, tmp_path: Path) -> FakeRunner:
    """Cluster pc1's runner; its controller runs job 42 on node1 and node2."""
    jobs = {"42": {"submit": SUBMIT, "state": "RUNNING", "nodes": "node1,node2"}}
    return FakeRunner(tmp_path / "controller", rt.store, "pc1", jobs)


def started(cluster: Cluster, **changes: Any) -> dict[str, Any]:
    return slurm_event("started", nodes=cluster.nodes, ssm_target=cluster.target, flavor=cluster.flavor, **changes)


def seed_hang(
    world: World, cluster: Cluster, crashed: str | None = None, last_words: str = CRASH, start_min: int = 110
) -> None:
    """The agent (JobName <cluster>-<id>-<name>, Host = the node): steps stop 40 min ago (at step `start_min` - 40),
    GPUs stay busy while power falls; each node's log (its own instance's stream) stops with them; `crashed` logged
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
        stream = stream_name(cluster.instances[node], log_key("pc1", "42"), node)
        world._put_logs(SLURM_LOG_GROUP, stream, lines + ([(40, last_words)] if dead else []))


def progress_alarm(rt) -> dict[str, Any]:
    fired = datetime.fromtimestamp(rt.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.000+0000")  # each its own event
    return alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "slurm", JOB, alarms.PROGRESS), fired)


def decide_until_stopped(rt, context, runner: FakeRunner) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's progress alarm fires (a warning), the sweeper decides after the grace, the runner answers, and the
    next sweep reads its answer: the decision, and the stop answers read."""
    warned = on_alarm.handler(progress_alarm(rt), context)
    assert warned["action"] == "warn", warned
    rt.clock.advance(6 * MINUTE)
    (stopped,) = sweeper.handler(scheduled_event(), context)["redecided"]
    runner.poll()
    rt.clock.advance(rt.config.sweeper_minutes * MINUTE)
    return stopped, sweeper.handler(scheduled_event(), context)["stop_answers"]


def reconcile(rt, context, runner: FakeRunner) -> dict[str, Any]:
    """A sweep asks the runner for the controller's view, the runner answers, the next sweep applies it."""
    sweeper.handler(scheduled_event(), context)
    runner.poll()
    rt.clock.advance(rt.config.sweeper_minutes * MINUTE)
    return sweeper.handler(scheduled_event(), context)


def test_a_started_job_is_kept_with_its_nodes_instances_and_watched_by_its_alarms(rt, cluster, context) -> None:
    # When the job's start event arrives
    result = on_job_state.handler(started(cluster, settings=ENFORCE), context)

    # Then its alarms are put under its name, reading each node's instance, and its facts are the event's
    assert (result["status"], result["job"]) == ("alarms_put", JOB)
    names = {a["AlarmName"] for a in all_alarms(rt.clients.cloudwatch)}
    assert alarms.alarm_name(rt.config.alarm_prefix, "slurm", JOB, alarms.GPU_IDLE, "node1") in names
    gpu = next(a for a in all_alarms(rt.clients.cloudwatch) if a["AlarmName"].endswith(f"{alarms.GPU_IDLE}.node1"))
    dims = [d for m in gpu["Metrics"] if "MetricStat" in m for d in m["MetricStat"]["Metric"]["Dimensions"]]
    assert dims == [{"Name": "InstanceId", "Value": cluster.instances["node1"]}]
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.status, facts.instance_ids, facts.instance_type) == ("InProgress", ("node1", "node2"), "p4d.24xlarge")
    assert facts.platform_ids["job_id"] == "42"
    assert JOB in rt.source(Platform.SLURM).running_jobs(rt.clock())


def test_a_hung_job_is_cancelled_by_the_runner_and_the_stop_is_done_when_the_controller_says_so(
    rt, world, slack, cluster, runner, context
) -> None:
    # Given a running job tagged enforce whose steps stopped 40 minutes ago
    on_job_state.handler(started(cluster, settings=ENFORCE), context)
    seed_hang(world, cluster)

    # When it is warned, then stopped after the grace, the runner answers and the sweeper reads the answer
    stopped, settled = decide_until_stopped(rt, context, runner)

    # Then scancel ran on the controller for this job (its cluster and submit time matched), and Slack heard it
    assert (stopped["action"], stopped["stopped"]) == ("stop", True)
    assert "sent to the runner of cluster pc1" in stopped["details"]["stop"]["detail"]
    assert runner.world()["jobs"]["42"]["state"] == "CANCELLED"
    assert [s["status"] for s in settled] == ["stopped"]
    assert "cancelled (CANCELLED)" in slack.texts()[-1]
    [stop] = rt.audit.stops(job_key(Platform.SLURM, JOB))
    assert stop.ok is True
    assert PendingStops(rt.store).oldest(10) == []
    assert not any(c[0] == "scontrol" and c[1] == "update" for c in runner.world()["calls"])  # no node drained

    # And the same sweep retired it as the controller's view said it ended, its alarms gone; its end event, when it
    # comes, changes nothing
    assert rt.source(Platform.SLURM).facts(JOB).secondary_status == "CANCELLED"
    assert not all_alarms(rt.clients.cloudwatch, AlarmNamePrefix=f"{rt.config.alarm_prefix}slurm.")
    ended = on_job_state.handler(slurm_event("ended", job_state="CANCELLED"), context)
    assert ended["status"] == "ignored"


def test_a_stop_the_runner_never_answers_is_given_back_as_failed(rt, world, slack, cluster, context) -> None:
    # Given a hung job whose cluster has no runner
    on_job_state.handler(started(cluster, settings=ENFORCE), context)
    seed_hang(world, cluster)
    on_alarm.handler(progress_alarm(rt), context)
    rt.clock.advance(6 * MINUTE)
    (stopped,) = sweeper.handler(scheduled_event(), context)["redecided"]
    # When the answer is looked for past its wait
    rt.clock.advance(11 * MINUTE)
    settled = sweeper.handler(scheduled_event(), context)["stop_answers"]
    # Then the stop failed, said why, and counts as no stop
    assert stopped["stopped"] is True  # queued
    assert [s["status"] for s in settled] == ["failed"]
    assert "no answer from the runner of cluster pc1" in slack.texts()[-1]
    assert [s.ok for s in rt.audit.stops(job_key(Platform.SLURM, JOB))] == [False]


def test_a_suspended_job_is_held_by_the_controllers_view_and_gets_no_stall_alert_or_stop(
    rt, world, slack, cluster, runner, context
) -> None:
    # Given a running job that looks hung, which an admin suspended (`scontrol suspend`: Slurm sends no event)
    on_job_state.handler(started(cluster, settings=ENFORCE), context)
    seed_hang(world, cluster)
    runner.set_state("42", "SUSPENDED")

    # When the sweeper reconciles the table with the controller's view, and the job's progress alarm fires
    reconcile(rt, context, runner)
    posts = len(slack.posts)
    decided = on_alarm.handler(progress_alarm(rt), context)
    rt.clock.advance(10 * MINUTE)
    swept = sweeper.handler(scheduled_event(), context)

    # Then the job is held (Paused), never judged: no warning, no stop, no Slack post, nothing sent to the runner
    assert decided.get("action") in (None, "none"), decided
    assert not [d for d in swept["redecided"] if d.get("action") == "stop"]
    assert len(slack.posts) == posts
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.status, facts.secondary_status) == ("Paused", "SUSPENDED")
    assert runner.world()["jobs"]["42"]["state"] == "SUSPENDED"
    assert rt.audit.stops(job_key(Platform.SLURM, JOB)) == []

    # And once the controller says it runs again, it is judged again, its suspension counted as its own badput
    runner.set_state("42", "RUNNING")
    reconcile(rt, context, runner)
    assert rt.source(Platform.SLURM).facts(JOB).status == "InProgress"
    _, spans = rt.source(Platform.SLURM).run_spans(rt.audit, JOB, rt.clock(), 60)
    assert [state for _, _, state in spans[0].held] == ["suspended"]


def test_a_job_suspended_since_the_last_view_is_left_alone_by_the_runner(
    rt, world, slack, cluster, runner, context
) -> None:
    # Given a job that Slurm suspended after the sweeper's last look, and looks hung
    on_job_state.handler(started(cluster, settings=ENFORCE), context)
    seed_hang(world, cluster)
    runner.set_state("42", "SUSPENDED")

    # When Stallwatch stops it and reads the runner's answer, then decides again
    _, [settled] = decide_until_stopped(rt, context, runner)
    rt.clock.advance(HELD_RECHECK_S - 5 * MINUTE)
    again = on_alarm.handler(progress_alarm(rt) | {"time": "2026-11-30T11:00:00Z"}, context)

    # Then nothing was cancelled, Slack heard why, and the job is not stopped while suspended
    assert settled["status"] == "held"
    assert runner.world()["jobs"]["42"]["state"] == "SUSPENDED"
    assert "left alone" in slack.texts()[-1]
    assert "SUSPENDED" in slack.texts()[-1]
    assert again.get("action") in (None, "none"), again
    assert rt.source(Platform.SLURM).facts(JOB).status == "Paused"
    assert [s.ok for s in rt.audit.stops(job_key(Platform.SLURM, JOB))] == [False]  # no stop to count


def test_a_crashed_rank_requeues_the_job_without_draining_its_node_then_its_next_attempt_is_watched(
    rt, world, slack, cluster, runner, context
) -> None:
    # Given a job that opted in to requeue; node2's rank died of a CUDA error (the application's) while node1 spins
    settings = ENFORCE | {"stallwatch:recover": "requeue"}
    on_job_state.handler(started(cluster, settings=settings), context)
    seed_hang(world, cluster, crashed="node2")

    # When it is stopped, and the sweeper reads the runner's answer
    stopped, [settled] = decide_until_stopped(rt, context, runner)

    # Then the job was requeued, not cancelled, as the run's first attempt; no node was drained for the application's
    # error
    assert stopped["stopped"] is True
    assert stopped["details"]["recovery"] == {"status": "requeued", "attempt": 1, "allowed": 3, "drained": []}
    assert runner.world()["drained"] == {}
    assert runner.world()["jobs"]["42"]["state"] == "PENDING"
    assert settled["status"] == "stopped"
    assert "requeue of Slurm job 42 sent" in str(slack.posts)
    assert "drained" not in str(slack.posts)

    # And the requeue's end retires the attempt without ending the run; the next attempt gets its alarms
    ended = on_job_state.handler(slurm_event("ended", job_state="REQUEUED", settings=settings), context)
    assert ended["status"] == "retired"
    assert "summary" not in ended
    nodes = (cluster.nodes[0], ("node3", "10.0.0.13"))
    next_attempt = slurm_event(
        "started",
        nodes=nodes,
        ssm_target=cluster.target,
        settings=settings,
        restarts=1,
        submit_epoch=1_796_003_000,
        start_epoch=1_796_003_030,
    )
    again = on_job_state.handler(next_attempt, context)
    assert again["status"] == "alarms_put"
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.instance_ids, facts.platform_ids["restarts"]) == (("node1", "node3"), "1")


def test_a_node_whose_gpu_fell_off_the_bus_is_drained_before_the_requeue(
    rt, world, slack, cluster, runner, context
) -> None:
    # Given a job that opted in to requeue; node2's kernel logged a hardware Xid as its rank died
    settings = ENFORCE | {"stallwatch:recover": "requeue"}
    on_job_state.handler(started(cluster, settings=settings), context)
    seed_hang(world, cluster, crashed="node2", last_words=XID)

    # When it is stopped, and the sweeper reads the runner's answer
    stopped, [settled] = decide_until_stopped(rt, context, runner)

    # Then node2, which a hardware signal blames, was drained with Stallwatch's reason, and the job requeued
    assert stopped["details"]["recovery"]["drained"] == ["node2"]
    drained = runner.world()["drained"]
    assert list(drained) == ["node2"]
    assert drained["node2"].startswith("stallwatch: ")
    assert runner.world()["jobs"]["42"]["state"] == "PENDING"
    assert settled["status"] == "stopped"
    assert "node2 drained" in slack.texts()[-1]


def _next_attempt(
    rt,
    world: World,
    cluster: Cluster,
    runner: FakeRunner,
    context,
    settings: dict[str, str],
    restarts: int,
    start_min: int,
) -> None:
    """Slurm ran the requeued job again (its attempt `restarts`) hours later; the attempt crashed the same way (node2's
    rank), its steps stopping at step `start_min` - 40."""
    rt.clock.advance(3 * 3600)
    world.now = rt.clock()
    submit = int(world.now) - 130 * 60
    event = started(cluster, settings=settings, restarts=restarts, submit_epoch=submit, start_epoch=submit + 30)
    runner.set_state(
        "42", "RUNNING", submit=event["detail"]["submit_time"], restarts=str(restarts), nodes="node1,node2"
    )
    assert on_job_state.handler(event, context)["status"] == "alarms_put"
    seed_hang(world, cluster, crashed="node2", start_min=start_min)


@pytest.mark.parametrize(
    ("budget", "steps", "gave_up"),
    [
        ({}, (110, 110), "gave up: no progress after 1 restart"),  # the same crash at the same step: no progress
        ({"stallwatch:resume": "1"}, (110, 130), "gave up: restart budget spent (1 of 1 restarts)"),
    ],
)
def test_a_crash_looping_job_is_stopped_after_its_budget_and_no_node_is_drained_for_its_application_error(
    rt, world, slack, cluster, runner, context, budget: dict[str, str], steps: tuple[int, ...], gave_up: str
) -> None:
    # Given a job that opted in to requeue, whose rank crashes the same way on every attempt (a CUDA error)
    settings = ENFORCE | {"stallwatch:recover": "requeue"} | budget
    on_job_state.handler(started(cluster, settings=settings), context)
    seed_hang(world, cluster, crashed="node2", start_min=steps[0])
    first, _ = decide_until_stopped(rt, context, runner)
    assert first["details"]["recovery"]["status"] == "requeued"
    ended = slurm_event("ended", job_state="REQUEUED", restarts=1, settings=settings)
    assert on_job_state.handler(ended, context)["status"] == "retired"

    # When its next attempt crashes again
    _next_attempt(rt, world, cluster, runner, context, settings, restarts=1, start_min=steps[1])
    second, _ = decide_until_stopped(rt, context, runner)

    # Then the loop ends: the job is cancelled rather than requeued, and Slack hears why
    assert second["details"]["recovery"] == {"status": "not_recovered", "reason": gave_up}
    assert second["details"]["stop"]["detail"].startswith("scancel of Slurm job 42 sent")
    assert runner.world()["jobs"]["42"]["state"] == "CANCELLED"
    assert f"not requeued: {gave_up}" in str(slack.posts[-2])  # the stop's message (the cancel's answer follows)
    # And no node was ever drained for the application's error
    assert runner.world()["drained"] == {}
    assert [c for c in runner.world()["calls"] if c[:2] == ["scontrol", "update"]] == []


def test_a_job_slurm_requeued_after_a_node_failed_is_watched_again_though_its_events_were_lost(
    rt, cluster, runner, context
) -> None:
    # Given a running job; its node2 failed and Slurm requeued it: it runs again on node1 and node3 with a new
    # submit time, and neither its end event nor its next start reached Stallwatch
    on_job_state.handler(started(cluster, settings=ENFORCE), context)
    runner.set_state("42", "RUNNING", submit="2026-11-30T10:30:00", restarts="1", nodes="node1,node3")

    # When the sweeper reconciles the table with the controller's view
    swept = reconcile(rt, context, runner)

    # Then the attempt that ran ended requeued, and the next one is watched: its alarms put, its nodes the
    # controller's (node1 keeping its instance)
    assert [(r["change"], r["status"]) for r in swept["reconciled"]] == [
        ("ended", "retired"),
        ("started", "alarms_put"),
    ]
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.status, facts.instance_ids, facts.platform_ids["restarts"]) == ("InProgress", ("node1", "node3"), "1")
    assert facts.host_instances == {"node1": cluster.instances["node1"]}
    assert all_alarms(rt.clients.cloudwatch, AlarmNamePrefix=f"{rt.config.alarm_prefix}slurm.")


def test_a_job_whose_end_event_was_lost_is_retired_and_never_judged_on_its_successors_gpus(
    rt, world, slack, cluster, runner, context
) -> None:
    # Given job 42 ended (its end event lost) and job 43 runs on the same nodes, busy
    on_job_state.handler(started(cluster, settings=ENFORCE), context)
    runner.set_state("42", "COMPLETED")
    seed_hang(world, cluster)  # 42's steps stopped; the nodes' GPUs are 43's

    # When the sweeper reconciles, and 42's alarm fires late
    swept = reconcile(rt, context, runner)
    posts = len(slack.posts)
    late = on_alarm.handler(progress_alarm(rt), context)

    # Then 42 was retired as the controller said it ended, its alarms gone; the late alarm judges nothing
    assert [(r["change"], r["status"]) for r in swept["reconciled"]] == [("ended", "retired")]
    assert rt.source(Platform.SLURM).running_jobs(rt.clock()) == {}
    assert not all_alarms(rt.clients.cloudwatch, AlarmNamePrefix=f"{rt.config.alarm_prefix}slurm.")
    assert late.get("action") in (None, "none"), late
    assert len(slack.posts) == posts


def test_a_hyperpod_job_is_watched_its_stop_goes_through_the_runner_and_drained_nodes_are_replaced(
    rt, world, slack, runner, context
) -> None:
    # Given a HyperPod cluster (its controller's target is HyperPod's SSM name) and a job that opted in to requeue,
    # hung with node2's rank dead of a hardware Xid
    cluster = hyperpod()
    settings = ENFORCE | {"stallwatch:recover": "requeue"}
    runner.set_state("42", "RUNNING", nodes="ip-10-1-0-1,ip-10-1-0-2")
    result = on_job_state.handler(started(cluster, settings=settings), context)
    seed_hyperpod_hang(world, cluster, crashed="ip-10-1-0-2", last_words=XID)

    # When it is stopped and the runner answers
    stopped, [settled] = decide_until_stopped(rt, context, runner)

    # Then it was watched, requeued by the runner (node2 drained), and node2's HyperPod instance replaced through
    # SageMaker's API, once
    assert result["status"] == "alarms_put"
    assert "requeue of Slurm job 42 sent to the runner" in stopped["details"]["stop"]["detail"]
    assert list(runner.world()["drained"]) == ["ip-10-1-0-2"]
    assert moto_hyperpod.calls == [("Replace", "2hd31rmi9mde", [cluster.instances["ip-10-1-0-2"]])]
    assert settled["status"] == "stopped"
    assert "BatchReplaceClusterNodes: 1 taken" in slack.texts()[-1]


def test_a_node_hyperpod_replaces_is_left_to_hyperpod_and_never_acted_on_twice(
    rt, world, slack, runner, context
) -> None:
    # Given a hung HyperPod job that opted in to requeue, whose node2 HyperPod is replacing (its reason Action:Replace)
    cluster = hyperpod()
    settings = ENFORCE | {"stallwatch:recover": "requeue"}
    runner.set_state("42", "RUNNING", nodes="ip-10-1-0-1,ip-10-1-0-2")
    runner.set_node("ip-10-1-0-2", "DOWN+FAIL", "Action:Replace : Not responding [slurm@2024-02-21T01:53:15]")
    on_job_state.handler(started(cluster, settings=settings), context)
    seed_hyperpod_hang(world, cluster, crashed="ip-10-1-0-2")

    # When the sweeper reconciles, and the job's alarm fires
    reconcile(rt, context, runner)
    posts = len(slack.posts)
    decided = on_alarm.handler(progress_alarm(rt), context)
    rt.clock.advance(10 * MINUTE)
    swept = sweeper.handler(scheduled_event(), context)

    # Then the job is HyperPod's meanwhile: no stop, no requeue, no drain, no SageMaker call of Stallwatch's own
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.status, facts.secondary_status) == ("Paused", "LEFT_TO_HYPERPOD")
    assert any("HyperPod replaces ip-10-1-0-2" in note for note in facts.notes)
    assert decided.get("action") in (None, "none"), decided
    assert not [d for d in swept["redecided"] if d.get("action") == "stop"]
    assert runner.world()["drained"] == {}
    assert moto_hyperpod.calls == []
    assert len(slack.posts) == posts
    # And the decision records HyperPod's verdict
    [audit, *_] = [r["record"] for r in rt.audit.records(job_key(Platform.SLURM, JOB), "audit")]
    assert any("HyperPod replaces ip-10-1-0-2" in reason for reason in audit["reasons"])


def _agent_line(world: World, cluster: Cluster, node: str) -> None:
    """HyperPod's health agent's real detection line (the corpus: it reboots the node, for its hardware), 20 minutes
    ago in `node`'s instance's stream of the cluster's log group."""
    (line,) = real_lines.hyperpod(kind="health_monitoring_agent")
    stream = f"{AGENT_STREAM_PREFIX}workers/{cluster.instances[node]}"
    world._put_logs(f"/aws/sagemaker/Clusters/train/{HYPERPOD_CLUSTER}", stream, [(20, line.text)])


def _node_health_event(world: World, cluster: Cluster, node: str, context: Any) -> None:
    """The AWS docs' node health event (the corpus), on `node`'s instance of the cluster, HyperPod replacing it."""
    event = json.loads((HYPERPOD_EVENTS / "node-health-unhealthy.json").read_text())
    arn = f"arn:aws:sagemaker:us-east-1:123456789012:cluster/{HYPERPOD_CLUSTER}"
    event["time"] = datetime.fromtimestamp(world.now - 20 * MINUTE, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event["resources"] = [arn]
    event["detail"] |= {"ClusterArn": arn, "InstanceId": cluster.instances[node]}
    event["detail"]["HealthSummary"]["RepairAction"] = "Replace"
    answer = on_job_state.handler(event, context)
    assert answer["reason"].startswith(f"recorded for {JOB}: HyperPod replaces"), answer


@pytest.mark.parametrize("said", [_agent_line, _node_health_event], ids=["health agent line", "node health event"])
def test_a_node_hyperpods_agent_or_event_acts_on_is_left_to_hyperpod_and_never_acted_on_twice(
    rt, world, slack, runner, context, said
) -> None:
    # Given a hung HyperPod job that opted in to requeue, whose node2 HyperPod's health agent said it acts on (its
    # line in the cluster's log group, or its node health event)
    cluster = hyperpod()
    runner.set_state("42", "RUNNING", nodes="ip-10-1-0-1,ip-10-1-0-2")
    on_job_state.handler(started(cluster, settings=ENFORCE | {"stallwatch:recover": "requeue"}), context)
    seed_hyperpod_hang(world, cluster, crashed="ip-10-1-0-2")
    if said is _agent_line:
        _agent_line(world, cluster, "ip-10-1-0-2")
    else:
        _node_health_event(world, cluster, "ip-10-1-0-2", context)

    # When the job's alarm fires, and the sweeper decides after the grace
    posts = len(slack.posts)
    decided = on_alarm.handler(progress_alarm(rt), context)
    rt.clock.advance(10 * MINUTE)
    swept = sweeper.handler(scheduled_event(), context)
    runner.poll()

    # Then the job is HyperPod's: no stop, no requeue, no drain, no SageMaker call of Stallwatch's, nothing posted,
    # and HyperPod's word is in the job's notes
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.status, facts.secondary_status) == ("Paused", "LEFT_TO_HYPERPOD")
    assert any("ip-10-1-0-2" in note for note in facts.notes), facts.notes
    assert decided.get("action") in (None, "none"), decided
    assert not [d for d in swept["redecided"] if d.get("action") == "stop"]
    assert runner.world()["drained"] == {}
    assert moto_hyperpod.calls == []
    assert len(slack.posts) == posts


def seed_hyperpod_hang(world: World, cluster: Cluster, crashed: str, last_words: str = CRASH) -> None:
    """A HyperPod job's hang, as the trainer agent alone tells it (no CloudWatch agent metrics of the account)."""
    world.steps_until(JOB, last_step_min=40)
    for node in cluster.instances:
        dead = node == crashed
        world.agent_host(JOB, node, "GPUUtilization", world.every_minute(110, 0.0 if dead else 100.0))
        world.agent_host(JOB, node, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))
        lines = [(m, f"step {110 - m} loss 2.31") for m in range(110, 39, -5)] + ([(40, last_words)] if dead else [])
        world._put_logs(SLURM_LOG_GROUP, stream_name(cluster.instances[node], log_key("pc1", "42"), node), lines)


def test_a_late_start_and_a_malformed_event_change_nothing(rt, cluster, context) -> None:
    on_job_state.handler(started(cluster), context)
    on_job_state.handler(slurm_event("ended", job_state="COMPLETED"), context)
    late = on_job_state.handler(started(cluster), context)
    assert late["status"] == "ignored"
    bad = started(cluster)
    bad["detail"]["job_id"] = "42; reboot"
    with pytest.raises(Exception, match="job_id"):
        on_job_state.handler(bad, context)
    assert not all_alarms(rt.clients.cloudwatch, AlarmNamePrefix=f"{rt.config.alarm_prefix}slurm.")


def test_a_nodes_fatal_line_wakes_the_jobs_decision_and_a_line_from_another_nodes_role_wakes_nothing(
    rt, world, cluster, context
) -> None:
    # Given a running job whose node2's rank died of a CUDA error 40 minutes ago while node1 spins
    on_job_state.handler(started(cluster, settings=ENFORCE), context)
    seed_hang(world, cluster, crashed="node2")
    line = [(world.now - 40 * MINUTE, CRASH)]
    key = log_key("pc1", "42")

    # When a line claiming node2's death arrives in a stream node1's instance wrote, then node2's own
    forged = on_log_line.handler(
        log_lines_event(SLURM_LOG_GROUP, stream_name(cluster.instances["node1"], key, "node2"), line), context
    )
    own = stream_name(cluster.instances["node2"], key, "node2")
    result = on_log_line.handler(log_lines_event(SLURM_LOG_GROUP, own, line), context)

    # Then the forged line made no decision; node2's own woke the job's: its crashed rank warned
    assert forged["status"] == "ignored"
    assert "no watched job writes this stream" in forged["details"]["reason"]
    assert (result["job"], result["status"], result["diagnosis"]) == (JOB, "decided", "crashed_rank")
    [audit, *_] = [r["record"] for r in rt.audit.records(job_key(Platform.SLURM, JOB), "audit")]
    assert audit["trigger"] == f"log:{own}"
    # And a line of no job this deployment heard of wakes nothing
    other = stream_name(cluster.instances["node1"], log_key("pc1", "43"), "node1")
    assert on_log_line.handler(log_lines_event(SLURM_LOG_GROUP, other, line), context)["status"] == "ignored"
