"""The AWS signal source reads each job at its own alarms' period, after the job's tags."""

from __future__ import annotations

import pytest

from localrun.moto_world import World
from stallwatch.aws.platforms import adapter
from stallwatch.core import contract, measures
from stallwatch.core.signals import Platform


def test_each_job_is_read_at_its_alarms_period_after_its_tags(rt, world: World) -> None:
    # Given a 60 s deployment, one job tagged for 10 s alarms and one untagged, both stepping every 10 s for 2 min
    world.create_job("fast-job", tags={"stallwatch:alarm-period-seconds": "10"})
    world.create_job("plain-job")
    every_10s = [(world.now - 120 + 10 * i, 1.0) for i in range(12)]
    for job in ("fast-job", "plain-job"):
        world.agent_job(job, "Steps", every_10s)

    # When both jobs' signals are read together
    source = adapter(Platform.SAGEMAKER, rt.clients)
    signals = source.many_job_signals(["fast-job", "plain-job"], world.now + 1)

    # Then the tagged job keeps its 10 s datapoints (one per window), the other gets 1-minute sums
    fast = signals["fast-job"].agent["Steps"]
    plain = signals["plain-job"].agent["Steps"]
    assert len(fast) == 12
    assert len(plain) < 12
    assert sum(plain.values()) == sum(fast.values()) == 12


def test_an_ec2_jobs_log_streams_are_found_without_listing_a_shared_group(rt, world: World) -> None:
    # Given an 8-node job whose nodes log, one node that never logged, and a group shared with 60 other instances
    nodes = world.launch(8, {"stallwatch:job": "llm-70b"})
    for other in range(60):
        world.ec2_logs(f"i-{other:017x}", [(200, "another job, long ago")])
    for node in nodes[:7]:
        world.ec2_logs(node, [(30, "step 1"), (2, f"[{node}] step 2")])
    calls: list[dict] = []
    rt.clients.logs.meta.events.register(
        "provide-client-params.logs.DescribeLogStreams", lambda params, **_: calls.append(dict(params))
    )
    source = adapter(Platform.EC2, rt.clients)

    # When the job's hosts' log freshness is read
    facts = source.facts("llm-70b")
    freshness = source.log_freshness(facts)

    # Then the 7 nodes that log are found among the group's most recent streams (2 pages at most of the 67), the
    # silent one is asked for by its prefix, and every fresh node's newest line is 2 minutes old
    assert sorted(freshness) == nodes[:7]
    assert {round((world.now - t) / 60) for t in freshness.values()} == {2}
    assert [c.get("orderBy") for c in calls] == ["LastEventTime", "LastEventTime", None]
    assert calls[-1]["logStreamNamePrefix"] == nodes[7]


def test_an_ec2_job_whose_nodes_all_log_needs_one_describe_log_streams(rt, world: World) -> None:
    nodes = world.launch(4, {"stallwatch:job": "llm-70b"})
    for node in nodes:
        world.ec2_logs(node, [(2, "step 2")])
    calls: list[dict] = []
    rt.clients.logs.meta.events.register(
        "provide-client-params.logs.DescribeLogStreams", lambda params, **_: calls.append(dict(params))
    )
    source = adapter(Platform.EC2, rt.clients)
    assert sorted(source.log_freshness(source.facts("llm-70b"))) == nodes
    assert len(calls) == 1


def test_the_sweepers_log_idle_history_is_read_per_host(rt, world: World) -> None:
    # Given a job whose sweeper published LogIdleSeconds every 5 minutes: a sawtooth of 20-minute log gaps
    world.create_job("rare-logger")
    sawtooth = [(world.now - m * 60, float(((120 - m) % 20) * 60)) for m in range(120, 0, -5)]
    world.metric(
        contract.NAMESPACE,
        contract.LOG_IDLE_SECONDS,
        {contract.DIM_JOB: "rare-logger", contract.DIM_HOST: "algo-1"},
        sawtooth,
        "Seconds",
    )

    # When the job's signals are read
    signals = adapter(Platform.SAGEMAKER, rt.clients).job_signals("rare-logger", world.now + 1)

    # Then the host carries the history, and its resets are the 20-minute gaps the engine learns
    assert signals.hosts["algo-1"].log_idle.values() == [v for _, v in sawtooth]
    assert measures.sawtooth_gap(signals.hosts.values()) == pytest.approx(20 * 60, abs=60)


def test_an_ec2_jobs_evidence_is_read_only_under_its_own_instances(rt, world: World) -> None:
    # Given a 2-node job, and evidence another writer of the group and the namespaces put under an instance that is
    # not one of the job's: a fatal line in its stream, idle GPUs, an agent heartbeat naming the job
    job = "llm-70b"
    nodes = world.launch(2, {"stallwatch:job": job})
    stranger = "i-0123456789abcdef0"
    for node in nodes:
        world.ec2_logs(node, [(2, "step 2 loss 1.9")])
        world.ec2_gpu(node, world.every_minute(30, 97.0))
    world.ec2_logs(stranger, [(1, "RuntimeError: CUDA error: an illegal memory access was encountered")])
    world.ec2_gpu(stranger, world.every_minute(30, 0.0))
    world.agent_host(job, stranger, "Heartbeat", world.every_minute(30, 1.0))

    # When the job's signals are read
    signals = adapter(Platform.EC2, rt.clients).job_signals(job, world.now)

    # Then its hosts are its instances alone: nothing the stranger wrote is in its evidence
    assert sorted(signals.hosts) == sorted(nodes)
    assert all(not host.error_lines for host in signals.hosts.values())
    assert all(min(host.gpu_util.values()) > 90 for host in signals.hosts.values())
