"""The AWS signal source reads each job at its own alarms' period, after the job's tags."""

from __future__ import annotations

from stallwatch.aws.source import AwsSignalSource
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
