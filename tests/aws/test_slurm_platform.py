"""The Slurm adapter on moto: what the events stored is the job (its attempts linked by cluster, id and restart
count; a reused id begins a new run), the sweep's listing and log freshness, its run for goodput, its requests
within AWS's limits."""

from __future__ import annotations

from typing import Any

import pytest

from localrun.moto_world import MINUTE, World
from stallwatch.aws.events import JobStateEvent, parse_event
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs, runs
from stallwatch.aws.source import JobReads, agent_search
from stallwatch.core import contract
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.goodput import Category, measure_goodput
from stallwatch.core.platforms.interface import Change
from stallwatch.core.platforms.slurm import stream_name
from stallwatch.core.signals import Platform, Series
from tests.fixtures.request_limits import recording
from tests.fixtures.slurm import slurm_event

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


def test_an_end_event_without_its_start_still_ends_the_job(rt) -> None:
    ended = change(rt, slurm_event("ended", job_state="FAILED", reason="NonZeroExitCode"))
    assert (ended.change, ended.run_goes_on) == (Change.ENDED, False)
    facts = rt.source(Platform.SLURM).facts(JOB)
    assert (facts.status, facts.secondary_status) == ("Failed", "FAILED")
    assert rt.source(Platform.SLURM).running_jobs(rt.clock()) == {}


def test_each_nodes_newest_line_is_read_from_the_jobs_streams_by_prefix(rt, world: World) -> None:
    change(rt, slurm_event("started"))
    world._put_logs(LOG_GROUP, stream_name(JOB, "node1"), [(3, "step 10")])
    world._put_logs(LOG_GROUP, stream_name(JOB, "node2"), [(7, "step 9")])
    world._put_logs(LOG_GROUP, stream_name("pc1-42-llm2", "node1"), [(1, "another job")])
    source = rt.source(Platform.SLURM)
    newest = source.newest_log_lines(source.running_jobs(rt.clock()), rt.clock())
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
def test_mapping_a_jobs_nodes_to_their_instances_stays_within_describe_instances_limits(rt, nodes: int) -> None:
    event = slurm_event("started", nodes=tuple((f"n{i}", f"10.1.{i // 250}.{i % 250}") for i in range(nodes)))
    with recording() as requests:
        change(rt, event)
    assert [v for r in requests for v in r.violations()] == []
    assert [r for r in requests if r.operation == "DescribeInstances"]


def test_hyperpod_nodes_are_not_looked_up_in_the_account(rt) -> None:
    with recording() as requests:
        change(rt, slurm_event("started", flavor="hyperpod"))
    assert not [r for r in requests if r.operation == "DescribeInstances"]
    assert rt.source(Platform.SLURM).facts(JOB).host_instances == {}


def test_a_large_jobs_node_freshness_reads_the_log_idle_datapoints_own_period(rt, world: World) -> None:
    # Given a 130-node job, whose per-node series are read at 120 s (`host_period`: one GetMetricData answer), and
    # node1's last line, a fatal one, 10 minutes ago; the sweeper's LogIdleSeconds of node1 in the 120 s datapoint
    # holding its latest publication, 10 s before the datapoint's end
    nodes = tuple((f"node{i}", f"10.2.{i // 250}.{i % 250}") for i in range(1, 131))
    change(rt, slurm_event("started", nodes=nodes, flavor="hyperpod"))
    crash = "[rank 3] RuntimeError: CUDA error: an illegal memory access was encountered"
    world._put_logs(LOG_GROUP, stream_name(JOB, "node1"), [(10, crash)])
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
