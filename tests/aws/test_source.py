"""The AWS signal source reads each job at its own alarms' period, after the job's tags."""

from __future__ import annotations

import pytest

from stallwatch.aws.source import AwsSignalSource
from stallwatch.core import contract, measures
from stallwatch.core.policy import Policy
from stallwatch.core.signals import Platform
from tests.fixtures.world import World


def test_each_job_is_read_at_its_alarms_period_after_its_tags(rt, world: World) -> None:
    # Given a 60 s deployment, one job tagged for 10 s alarms and one untagged, both stepping every 10 s for 2 min
    world.create_job("fast-job", tags={"stallwatch:alarm-period-seconds": "10"})
    world.create_job("plain-job")
    every_10s = [(world.now - 120 + 10 * i, 1.0) for i in range(12)]
    for job in ("fast-job", "plain-job"):
        world.agent_job(job, "Steps", every_10s)

    # When both jobs' signals are read together
    source = AwsSignalSource(rt.clients, Platform.SAGEMAKER, Policy())
    signals = source.many_job_signals(["fast-job", "plain-job"], world.now + 1)

    # Then the tagged job keeps its 10 s datapoints (one per window), the other gets 1-minute sums
    fast = signals["fast-job"].agent["Steps"]
    plain = signals["plain-job"].agent["Steps"]
    assert len(fast) == 12
    assert len(plain) < 12
    assert sum(plain.values()) == sum(fast.values()) == 12


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
    signals = AwsSignalSource(rt.clients, Platform.SAGEMAKER, Policy()).job_signals("rare-logger", world.now + 1)

    # Then the host carries the history, and its resets are the 20-minute gaps the engine learns
    assert signals.hosts["algo-1"].log_idle.values() == [v for _, v in sawtooth]
    assert measures.sawtooth_gap(signals.hosts.values()) == pytest.approx(20 * 60, abs=60)
