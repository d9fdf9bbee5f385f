"""The control plane against a real Slurm (`make slurm`), with the cluster's runner on its controller: deploy/slurm's
events reach the real handlers (on a local AWS), the sweeper reconciles the table with the controller's view through
the runner, and a stop goes through the runner. A suspended job is held, never stopped; a job requeued after its node
failed is watched again as a new attempt, whether its events came or not; a job whose end event was lost is retired,
never judged on the next job's GPUs; a job of a HyperPod-style controller is watched and stopped through the runner;
a forged line (another user's, or another node's role's) neither stops, drains nor requeues a job, and a forged start
or end neither changes its tags nor ends it."""

from __future__ import annotations

import copy
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from handlers import on_alarm, on_job_state, on_log_line, sweeper
from localrun import aws_events, moto_hyperpod
from localrun.local_aws import LocalAws, scoped_environ
from localrun.moto_world import LambdaContext, alarm_event, all_alarms, log_lines_event
from localrun.resources import create_resources
from localrun.slack_receiver import SlackReceiver
from localrun.slurm_daemons import SlurmDaemons
from localrun.slurm_events import EventSpool
from localrun.slurm_runner import RunnerProcess
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs
from stallwatch.aws.platforms.slurm_runner import Runners
from stallwatch.aws.store import Store
from stallwatch.core import alarms
from stallwatch.core.platforms.slurm import log_key, slurm_job_name, stream_name
from stallwatch.core.signals import Platform
from stallwatch.runtime import environment
from tests.fixtures.slurm import DEADLINE_S, HYPERPOD_CLUSTER, HYPERPOD_TARGET

pytestmark = pytest.mark.slow
CLUSTER = "watch"
TASK = "sleep 300"
ENFORCE = "--comment=stallwatch:mode=enforce"
NOBODY = 65534
CRASH = "[rank 1] RuntimeError: CUDA error: an illegal memory access was encountered"


@dataclass
class Watched:
    """The real Slurm, its events, the local AWS the handlers run against, and Slack."""

    slurm: SlurmDaemons
    events: EventSpool
    store: Store
    slack: SlackReceiver
    aws: LocalAws

    def deliver(self, job: str, count: int) -> list[dict[str, Any]]:
        """The job's next `count` events, each handed to on_job_state as EventBridge would; its answers."""
        found = self.events.wait(count, DEADLINE_S, keep=lambda e: e["detail"]["job_id"] == job)
        assert len(found) == count, found
        return [on_job_state.handler(event, LambdaContext()) for event in found]

    def sweep(self) -> dict[str, Any]:
        return sweeper.handler(aws_events.scheduled(time.time()), LambdaContext())

    def reconcile(self) -> dict[str, Any]:
        """A sweep asks for the controller's view; once the runner answered, the next sweep applies it."""
        self.sweep()
        runners = Runners(self.store)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            clusters = {job.cluster for job in SlurmJobs(self.store).running().values()}
            if all(runners.report(cluster)[1] is not None for cluster in clusters):
                break
            time.sleep(0.5)
        return self.sweep()

    def facts(self, name: str) -> Any:
        return environment.runtime().source(Platform.SLURM).facts(name)


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    root = Path(tmp_path_factory.mktemp("slurm-watch"))
    logs = Path(tempfile.mkdtemp(prefix="swlogs-")) / "slurm"
    logs.parent.chmod(0o755)  # as /var/log: any user may enter, only the Prolog's folder below decides who writes
    with LocalAws() as aws, SlackReceiver() as slack:
        resources = create_resources(
            aws.client("dynamodb"), aws.client("secretsmanager"), aws.client("scheduler"), slack.webhook_url
        )
        with scoped_environ(dict(resources.function_env())):
            environment.runtime.cache_clear()  # a cold start: this module's endpoint, table and secret
            events = EventSpool(root / "events", ssm_target=HYPERPOD_TARGET, platform="hyperpod", log_dir=logs)
            script = events.install(root / "slurm" / "slurm.conf")
            daemons = SlurmDaemons(
                root / "slurm", cluster=CLUSTER, prolog=script, epilog=script, node_prolog=events.node_prolog
            )
            store = Store(aws.client("dynamodb"), resources.table_name, 1)
            with daemons, RunnerProcess(daemons, aws.env, resources.table_name):
                yield Watched(daemons, events, store, slack, aws)
            environment.runtime.cache_clear()
    shutil.rmtree(logs.parent, ignore_errors=True)


@pytest.fixture
def world(watched: Watched) -> Watched:
    """The module's cluster at rest, and no job left running in the table."""
    watched.slurm.reset(DEADLINE_S)
    watched.events.take()
    jobs = SlurmJobs(watched.store)
    for job in jobs.running().values():
        jobs.retire(job, "CANCELLED", time.time(), "the test before's")
    return watched


def _run(slurm: SlurmDaemons, *args: str, wrapper: str = "") -> tuple[str, dict[str, str]]:
    """A 2-node job with its task started on each node (through `wrapper`, deploy/slurm's log wrapper, if given)."""
    job = slurm.sbatch(["--nodes=2", "--job-name=llm", *args, "--wrap", f"srun {wrapper} {TASK}"])
    fields = slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)
    slurm.wait_for_tasks(TASK, 2, DEADLINE_S)
    return job, fields


def test_an_event_with_a_hyperpod_style_target_is_watched_and_its_stop_goes_through_the_runner(world: Watched) -> None:
    # Given a job of a cluster whose events name HyperPod's controller (sagemaker-cluster:<id>_<group>-<instance>)
    job, _ = _run(world.slurm, ENFORCE)
    [started] = world.deliver(job, 1)
    name = slurm_job_name(CLUSTER, job, "llm")
    # When Stallwatch stops it
    source = environment.runtime().source(Platform.SLURM)
    stop = source.stop(world.facts(name))
    # Then the event was taken (the job watched, its alarms put), and the runner cancelled it on the controller
    assert started["status"] == "alarms_put"
    assert world.facts(name).platform_ids["ssm_target"] == HYPERPOD_TARGET
    assert stop.ok, stop.detail
    assert world.slurm.wait_for(job, {"CANCELLED"}, DEADLINE_S)["JobState"] == "CANCELLED"
    deadline = time.monotonic() + DEADLINE_S
    outcome = None
    while outcome is None and time.monotonic() < deadline:
        outcome = source.stop_outcome(world.facts(name), stop, time.time(), time.time())
        time.sleep(0.5)
    assert outcome is not None
    assert outcome.ok
    assert outcome.detail.startswith("cancelled")


def test_a_suspended_job_is_held_by_the_controllers_view_and_not_stopped(world: Watched) -> None:
    # Given a running job an admin suspended (Slurm sends no event)
    job, _ = _run(world.slurm, ENFORCE)
    world.deliver(job, 1)
    name = slurm_job_name(CLUSTER, job, "llm")
    world.slurm.scontrol("suspend", job)
    try:
        # When the sweeper reconciles with the controller's view, and the job's progress alarm fires
        world.reconcile()
        prefix = environment.runtime().config.alarm_prefix
        posts = len(world.slack.messages)
        decided = on_alarm.handler(
            alarm_event(alarms.alarm_name(prefix, "slurm", name, alarms.PROGRESS)), LambdaContext()
        )
        # Then it is held (Paused, SUSPENDED): judged not, stopped not, nothing posted, still suspended
        facts = world.facts(name)
        assert (facts.status, facts.secondary_status) == ("Paused", "SUSPENDED")
        assert decided.get("action") in (None, "none"), decided
        assert len(world.slack.messages) == posts
        assert world.slurm.job(job)["JobState"] == "SUSPENDED"
    finally:
        world.slurm.scontrol("resume", job)
        world.slurm.command("scancel", job)


def test_a_job_requeued_after_its_node_failed_is_watched_again_as_a_new_attempt(world: Watched) -> None:
    # Given a running job whose start was heard
    job, fields = _run(world.slurm, ENFORCE)
    world.deliver(job, 1)
    name = slurm_job_name(CLUSTER, job, "llm")
    node = world.slurm.hostnames(fields["NodeList"])[1]
    try:
        # When its node fails (Slurm requeues it) and the job runs again, and its events reach on_job_state
        world.slurm.scontrol("update", f"nodename={node}", "state=down", "reason=failed")
        again = world.slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)
        ended, restarted = world.deliver(job, 2)
        # Then the attempt that ran ended, and the new one is watched: its start taken, its alarms put
        assert (ended["status"], restarted["status"]) == ("retired", "alarms_put")
        facts = world.facts(name)
        assert (facts.status, facts.platform_ids["restarts"], facts.platform_ids["submit_time"]) == (
            "InProgress",
            "1",
            again["SubmitTime"],
        )
        assert [a.state for a in SlurmJobs(world.store).attempts(name)] == ["REQUEUED", "CONFIGURING"]
    finally:
        world.slurm.command("scancel", job)
        world.slurm.command("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def test_a_requeue_whose_events_were_lost_is_found_by_reconciliation_and_watched(world: Watched) -> None:
    job, fields = _run(world.slurm, ENFORCE)
    world.deliver(job, 1)
    name = slurm_job_name(CLUSTER, job, "llm")
    node = world.slurm.hostnames(fields["NodeList"])[1]
    try:
        world.slurm.scontrol("update", f"nodename={node}", "state=down", "reason=failed")
        again = world.slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)
        world.events.take()  # lost
        swept = world.reconcile()
        assert [(r["change"], r["status"]) for r in swept["reconciled"]] == [
            ("ended", "retired"),
            ("started", "alarms_put"),
        ]
        facts = world.facts(name)
        assert (facts.status, facts.platform_ids["submit_time"]) == ("InProgress", again["SubmitTime"])
    finally:
        world.slurm.command("scancel", job)
        world.slurm.command("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def test_a_job_whose_end_event_was_lost_is_retired_and_never_judged_on_its_successors_gpus(world: Watched) -> None:
    # Given a job that ran and ended, its end event lost, and the next job on the same nodes
    first, _ = _run(world.slurm, ENFORCE)
    world.deliver(first, 1)
    world.slurm.command("scancel", first)
    world.slurm.wait_for(first, {"CANCELLED"}, DEADLINE_S)
    world.events.take()  # lost
    second, _ = _run(world.slurm)
    name = slurm_job_name(CLUSTER, first, "llm")
    try:
        # When the sweeper reconciles, and the first job's alarm fires late
        swept = world.reconcile()
        prefix = environment.runtime().config.alarm_prefix
        late = on_alarm.handler(alarm_event(alarms.alarm_name(prefix, "slurm", name, alarms.PROGRESS)), LambdaContext())
        # Then the first job is retired as the controller said it ended, and the late alarm judges nothing
        assert [(r["change"], r["status"]) for r in swept["reconciled"]] == [("ended", "retired")]
        assert world.facts(name).status.ended
        assert late.get("action") in (None, "none"), late
    finally:
        world.slurm.command("scancel", second)


def test_a_forged_line_of_another_user_or_another_nodes_role_neither_stops_drains_nor_requeues_a_job(
    world: Watched,
) -> None:
    # Given a HyperPod job that opted in to requeue, its nodes SageMaker's instances, its tasks writing through the
    # log wrapper into the files each node's Prolog made for the job's user
    instances = {"node1": "i-0000000000000a001", "node2": "i-0000000000000a002"}
    for node, instance in instances.items():
        moto_hyperpod.add_node(HYPERPOD_CLUSTER, "workers", instance, node)
    job, _ = _run(
        world.slurm,
        "--comment=stallwatch:mode=enforce,stallwatch:recover=requeue",
        wrapper=str(world.events.log_wrapper),
    )
    world.deliver(job, 1)
    name = slurm_job_name(CLUSTER, job, "llm")
    key = log_key(CLUSTER, job)
    own = world.events.log_dir / f"{key}.node2.log"
    try:
        # When another user of node2 appends a CUDA error to the job's file, and node1's role sends one as node2's
        wrote = subprocess.run(
            ["sh", "-c", f"echo '{CRASH}' >> {own}"], user=NOBODY, capture_output=True, check=False
        ).returncode
        line = [(time.time(), CRASH)]
        slurm_group = environment.runtime().config.log_group("slurm")
        forged = stream_name(instances["node1"], key, "node2")
        woke = on_log_line.handler(log_lines_event(slurm_group, forged, line), LambdaContext())
        swept = world.reconcile()

        # Then the job's streams are known (each node's own instance), the user could not write, the other role's
        # line woke nothing, and the job runs on untouched: no stop, no requeue, no node drained
        assert world.facts(name).host_instances == instances
        assert wrote != 0
        assert CRASH not in own.read_text()
        assert woke["status"] == "ignored"
        assert not [d for d in swept["redecided"] if d.get("action") == "stop"]
        fields = world.slurm.job(job)
        assert (fields["JobState"], fields["Restarts"]) == ("RUNNING", "0")
        assert {world.slurm.node_state(node) for node in instances} <= {"ALLOCATED", "MIXED"}
    finally:
        world.slurm.command("scancel", job)
        moto_hyperpod.reset()


def test_a_forged_start_changes_no_tags_and_a_forged_end_ends_nothing(world: Watched) -> None:
    # Given a running job that opted in to nothing, its start heard from the controller's Prolog
    job, _ = _run(world.slurm)
    [real] = world.events.wait(1, DEADLINE_S, keep=lambda e: e["detail"]["job_id"] == job)
    on_job_state.handler(real, LambdaContext())
    name = slurm_job_name(CLUSTER, job, "llm")
    prefix = environment.runtime().config.alarm_prefix
    watched = all_alarms(world.aws.client("cloudwatch"), AlarmNamePrefix=alarms.job_alarm_prefix(prefix, "slurm", name))
    try:
        # When events shaped as the controller's say the job opted in to stops and requeues, then that it ended
        # (a newer submit time than its own: an attempt no start was heard of)
        opted = copy.deepcopy(real)
        opted["detail"]["settings"] = {"stallwatch:mode": "enforce", "stallwatch:recover": "requeue"}
        ended = copy.deepcopy(real)
        ended["detail"] |= {"state": "ended", "job_state": "CANCELLED", "exit_code": "0:15"}
        ended["detail"]["submit_epoch"] += 500
        answers = [on_job_state.handler(event, LambdaContext()) for event in (opted, ended)]

        # Then neither changed the job: its tags are its own start's, it runs, and its alarms are all there
        assert [a["status"] for a in answers] == ["ignored", "ignored"]
        facts = world.facts(name)
        assert (facts.tags, facts.status) == ({}, "InProgress")
        again = all_alarms(
            world.aws.client("cloudwatch"), AlarmNamePrefix=alarms.job_alarm_prefix(prefix, "slurm", name)
        )
        assert watched
        assert again == watched
    finally:
        world.slurm.command("scancel", job)
