"""The Slurm adapter on moto: what the events stored is the job (its attempts linked by cluster, id and restart
count; a reused id begins a new run; a start never rewrites an attempt, an end ends only the attempt it names), its
nodes matched to instances in the controller's own VPC (or through SageMaker on HyperPod), the sweep's listing and
each node's own stream, its run for goodput, its requests within AWS's limits."""

from __future__ import annotations

from typing import Any

import pytest

from localrun import moto_hyperpod
from localrun.moto_world import MINUTE, World
from stallwatch.aws.events import JobStateEvent, parse_event
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs, runs
from stallwatch.aws.source import JobReads, agent_search
from stallwatch.core import contract
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.goodput import Category, measure_goodput
from stallwatch.core.platforms.hyperpod import HARDWARE, NONE, REPLACE, HyperPodAction
from stallwatch.core.platforms.interface import Change, WayBackAttempt
from stallwatch.core.platforms.slurm import SlurmJob, log_key, stream_name
from stallwatch.core.signals import Platform, Series
from stallwatch.core.way_back import blamed_hosts
from tests.fixtures.request_limits import recording
from tests.fixtures.slurm import hyperpod, parallelcluster, slurm_event

JOB = "pc1-42-llm"
LOG_GROUP = StallwatchConfig().log_group("slurm")


def change(rt, event: dict[str, Any]) -> Any:
    return rt.source(Platform.SLURM).job_change(parse_event(event, JobStateEvent))


def test_an_ended_attempt_and_its_requeued_successor_are_one_run_and_a_reused_id_begins_another(rt) -> None:
    # Given a job that ran, was requeued, ran again and completed; then a new job that got the same id and name
    change(rt, slurm_event("started", submit_epoch=1000, start_epoch=1100))
    requeued = change(rt, slurm_event("ended", job_state="REQUEUED", restarts=1, submit_epoch=1000, start_epoch=1100))
    change(rt, slurm_event("started", restarts=1, submit_epoch=1300, start_epoch=1400))
    change(rt, slurm_event("ended", job_state="COMPLETED", restarts=1, submit_epoch=1300, start_epoch=1400))
    change(rt, slurm_event("started", submit_epoch=9000, start_epoch=9100))

    # Then the requeue's end goes on with the run, and the attempts are three under one name, in two runs
    assert (requeued.change, requeued.run_goes_on) == (Change.ENDED, True)
    attempts = SlurmJobs(rt.store).attempts(JOB)
    assert [(a.submit_epoch, a.restarts, a.state) for a in attempts] == [
        (1000, 0, "REQUEUED"),
        (1300, 1, "COMPLETED"),
        (9000, 0, "CONFIGURING"),
    ]
    assert [[a.submit_epoch for a in run] for run in runs(attempts)] == [[1000, 1300], [9000]]
    assert rt.source(Platform.SLURM).facts(JOB).platform_ids["submit_epoch"] == "9000"  # the newest
    assert list(rt.source(Platform.SLURM).running_jobs(rt.clock())) == [JOB]


def test_an_end_event_of_no_attempt_heard_to_start_changes_nothing(rt) -> None:
    ended = change(rt, slurm_event("ended", job_state="FAILED", reason="NonZeroExitCode"))
    assert (ended.change, ended.reason) == (Change.IGNORED, "an end of no attempt that was heard to run")
    assert SlurmJobs(rt.store).attempts(JOB) == []


def test_a_repeated_start_never_rewrites_the_running_attempts_tags_and_a_forged_end_ends_nothing(rt) -> None:
    # Given a running attempt with no settings
    change(rt, slurm_event("started"))
    # When a second start of the same attempt claims it opted in to stops and requeues, and an end names a newer
    # submit time than the attempt's (no attempt of it was heard to start)
    again = change(rt, slurm_event("started", settings={"stallwatch:mode": "enforce", "stallwatch:recover": "requeue"}))
    forged = change(rt, slurm_event("ended", job_state="CANCELLED", submit_epoch=1_796_000_500))
    # Then neither changed the attempt: its tags are its first start's, and it runs
    assert (again.change, forged.change) == (Change.IGNORED, Change.IGNORED)
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.tags, facts.status) == ({}, "InProgress")
    assert list(rt.source(Platform.SLURM).running_jobs(rt.clock())) == [JOB]


def test_a_requeues_next_start_ends_the_attempt_whose_end_was_read_after_the_requeue(rt) -> None:
    # Given a running attempt; Slurm requeued it (a node failed), and its end event named the next attempt's submit
    # time (read after the requeue had moved it)
    change(rt, slurm_event("started", submit_epoch=1000, start_epoch=1100))
    ended = change(rt, slurm_event("ended", job_state="PENDING", submit_epoch=1005))
    # When the next attempt starts
    started = change(rt, slurm_event("started", submit_epoch=1005, start_epoch=1200, restarts=1))
    # Then the misnamed end made up no attempt, the start was taken (not refused as a duplicate), and the attempt
    # before it ended requeued
    assert (ended.change, started.change) == (Change.IGNORED, Change.STARTED)
    assert [(a.submit_epoch, a.state) for a in SlurmJobs(rt.store).attempts(JOB)] == [
        (1000, "REQUEUED"),
        (1005, "CONFIGURING"),
    ]
    assert rt.source(Platform.SLURM).facts(JOB).platform_ids["restarts"] == "1"


def test_each_nodes_newest_line_is_read_from_its_own_instances_stream(rt, world: World) -> None:
    # Given a running job on two instances, each node's stream, and a stream naming node2 that node1's role wrote
    cluster = parallelcluster(world)
    change(rt, slurm_event("started", nodes=cluster.nodes, ssm_target=cluster.target))
    key, node1, node2 = log_key("pc1", "42"), cluster.instances["node1"], cluster.instances["node2"]
    world._put_logs(LOG_GROUP, stream_name(node1, key, "node1"), [(3, "step 10")])
    world._put_logs(LOG_GROUP, stream_name(node2, key, "node2"), [(7, "step 9")])
    world._put_logs(LOG_GROUP, stream_name(node1, key, "node2"), [(1, "forged: node2 is fine")])
    world._put_logs(LOG_GROUP, stream_name(node1, log_key("pc1", "43"), "node1"), [(1, "another job")])
    # When the sweep reads the nodes' freshness
    source = rt.source(Platform.SLURM)
    newest = source.newest_log_lines(source.running_jobs(rt.clock()), rt.clock())
    # Then each node's is its own stream's
    assert {(job, host): round((world.now - t) / 60) for job, host, t in newest} == {
        (JOB, "node1"): 3,
        (JOB, "node2"): 7,
    }


def test_a_requeued_runs_goodput_counts_the_wait_as_the_scheduler_held_it(rt) -> None:
    change(rt, slurm_event("started", submit_epoch=1000, start_epoch=1100))
    change(
        rt,
        slurm_event(
            "ended", job_state="REQUEUED", restarts=1, submit_epoch=1000, start_epoch=1100, time="1970-01-01T00:30:00Z"
        ),
    )
    change(rt, slurm_event("started", restarts=1, submit_epoch=1900, start_epoch=2000))
    run, spans = rt.source(Platform.SLURM).run_spans(rt.audit, JOB, 2600.0, 60)
    goodput = measure_goodput(run, spans)
    seconds = {c: round(t.seconds) for c, t in goodput.totals.items() if t.seconds}
    # pending 100 s before the first attempt's nodes, held 1,800 s - 1,100 s, requeued until the next one's nodes
    assert seconds[Category.PENDING] == 100
    assert seconds[Category.REQUEUED] == 2000 - 1800
    assert goodput.wall_s == 2600 - 1000


@pytest.mark.parametrize("nodes", [3, 250])
def test_mapping_a_jobs_nodes_to_their_instances_stays_within_describe_instances_limits(rt, world, nodes) -> None:
    controller = parallelcluster(world, count=1).target
    nodes_of = tuple((f"n{i}", f"10.1.{i // 250}.{i % 250}") for i in range(nodes))
    with recording() as requests:
        change(rt, slurm_event("started", nodes=nodes_of, ssm_target=controller))
    assert [v for r in requests for v in r.violations()] == []
    assert len([r for r in requests if r.operation == "DescribeInstances"]) >= 2  # the controller's VPC, the nodes


def test_nodes_are_matched_to_instances_in_the_controllers_vpc_only(rt, world: World) -> None:
    # Given a cluster, and another VPC whose instance has node1's address
    cluster = parallelcluster(world)
    ec2 = world.clients.ec2
    node1_addr = dict(cluster.nodes)["node1"]
    first, second, *_ = node1_addr.split(".")
    other_vpc = ec2.create_vpc(CidrBlock=f"{first}.{second}.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=other_vpc, CidrBlock=f"{node1_addr.rsplit('.', 1)[0]}.0/24")["Subnet"]["SubnetId"]
    [stranger] = ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SubnetId=subnet, PrivateIpAddress=node1_addr
    )["Instances"]
    # When the job starts
    change(rt, slurm_event("started", nodes=cluster.nodes, ssm_target=cluster.target))
    # Then its nodes are the instances of its controller's VPC, never the other VPC's
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert facts.host_instances == cluster.instances
    assert stranger["InstanceId"] not in facts.host_instances.values()


def test_hyperpod_nodes_are_found_through_sagemaker_not_in_the_account(rt) -> None:
    # Given a HyperPod cluster's nodes as SageMaker lists them, and its controller's SSM name as the target
    cluster = hyperpod()
    with recording() as requests:
        started = change(rt, slurm_event("started", nodes=cluster.nodes, ssm_target=cluster.target, flavor="hyperpod"))
    # Then the event is taken, no EC2 instance of the account is looked up, and each node has its HyperPod instance
    assert started.change is Change.STARTED
    assert not [r for r in requests if r.operation == "DescribeInstances"]
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert facts.host_instances == cluster.instances
    assert rt.source(Platform.SLURM).facts(JOB).platform_ids["ssm_target"] == cluster.target
    assert moto_hyperpod.nodes  # the extension's cluster, read by ListClusterNodes


def test_a_requeue_drains_the_node_hyperpods_hardware_verdict_blames_and_never_one_hyperpod_acts_on(rt) -> None:
    # Given a HyperPod job opted in to requeue: HyperPod replaces ip-10-1-0-1 (its node reason), and its health event
    # blames ip-10-1-0-2's hardware without acting on it
    cluster = hyperpod()
    settings = {"stallwatch:recover": "requeue"}
    started = slurm_event(
        "started", nodes=cluster.nodes, ssm_target=cluster.target, flavor="hyperpod", settings=settings
    )
    change(rt, started)
    source, now = rt.source(Platform.SLURM), rt.clock()
    submit = source.jobs.current(JOB).submit_epoch
    replacing = HyperPodAction(REPLACE, HARDWARE, "node reason", now, node="ip-10-1-0-1", said="Action:Replace")
    blaming = HyperPodAction(NONE, HARDWARE, "health event", now, node="ip-10-1-0-2", said="NVLink errors")
    for found in (replacing, blaming):
        source.jobs.record_hyperpod(JOB, submit, found)
    facts = source.facts(JOB)

    # When its way back is asked for, the hosts blamed as the runtime blames them (no other signal)
    blamed = blamed_hosts({}, facts.instance_ids, 60, now, facts.hardware_faults)
    attempt = WayBackAttempt(facts, now, "audit#1", now, "hang", (), None, now, 1, 3, blamed=blamed)
    result = source.way_back(attempt, teller=None)

    # Then both are blamed, but only ip-10-1-0-2 is drained: the node HyperPod replaces is left to it
    assert sorted(blamed) == ["ip-10-1-0-1", "ip-10-1-0-2"]
    assert result.audited["drained"] == ["ip-10-1-0-2"]
    assert result.audited["left_to_hyperpod"] == ["ip-10-1-0-1"]
    assert result.stop is not None
    assert result.stop.ok
    assert result.stop.detail.endswith("ip-10-1-0-2 drained first")


def test_a_large_jobs_node_freshness_reads_the_log_idle_datapoints_own_period(rt, world: World) -> None:
    # Given a 130-node job, whose per-node series are read at 120 s (`host_period`: one GetMetricData answer), and
    # node1's last line, a fatal one, 10 minutes ago; the sweeper's LogIdleSeconds of node1 in the 120 s datapoint
    # holding its latest publication, 10 s before the datapoint's end
    nodes = tuple((f"node{i}", f"10.2.{i // 250}.{i % 250}") for i in range(1, 131))
    event = parse_event(slurm_event("started", nodes=nodes, flavor="hyperpod"), JobStateEvent)
    instances = {name: (f"i-0{i:016x}", "p5.48xlarge") for i, (name, _) in enumerate(nodes, start=1)}
    SlurmJobs(rt.store).start(SlurmJob.of_event(event.detail).with_instances(instances), world.now)
    crash = "[rank 3] RuntimeError: CUDA error: an illegal memory access was encountered"
    world._put_logs(LOG_GROUP, stream_name(instances["node1"][0], log_key("pc1", "42"), "node1"), [(10, crash)])
    last_line, period, published = world.now - 10 * MINUTE, 120, 110.0
    t = world.now - 5 * MINUTE  # the datapoint's start
    source = rt.source(Platform.SLURM)
    facts = source.facts(JOB)
    reads = JobReads(log_idle=agent_search(contract.LOG_IDLE_SECONDS, ((contract.DIM_JOB, JOB),), "Maximum", period))
    per_host = {reads.log_idle: {"node1": Series(((t, t + published - last_line),))}}

    # When its nodes' logs are read
    logs = source._host_logs(facts, ["node1"], per_host, reads, {}, world.now)

    # Then node1's newest event is bounded by the datapoint's end, as on every platform (not 60 s after its start,
    # which puts it 50 s before the line the sweeper saw), and the tail read up to it holds the fatal line
    assert logs["node1"].last_t == pytest.approx(t + period - (t + published - last_line))
    assert [line.message for line in logs["node1"].lines] == [crash]
