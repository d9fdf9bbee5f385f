"""The fault mix's Slurm jobs (issue 30 item 7): drawn after the SageMaker and EC2 jobs, which stay as they were, laid
out as on ParallelCluster (nodes that are instances, one stream per job and node), and held to the same goals."""

from __future__ import annotations

import pytest

from bench import faultmix
from corpus import faults
from corpus.faults import Episode, Fault, Job, draw_jobs, simulate
from stallwatch.core import contract
from stallwatch.core.platforms.slurm import SLURM, log_key, slurm_job_name, stream_name
from stallwatch.core.signals import Platform
from stallwatch.core.trace import LogEvent, MetricEvent
from tests.offline.test_fault_mix import HOUR, job


def slurm_job(name: str, fault: Fault | None = None, **shape: object) -> Job:
    fields: dict = {"platform": Platform.SLURM, "ec2_power": True} | shape
    return job(slurm_job_name("pcfm", "4242", name), fault, **fields)


def test_slurm_jobs_follow_the_others_which_are_the_same_as_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = draw_jobs(seed=3, job_days=20)
    monkeypatch.setattr(faults, "SLURM_SHARE", 0.0)
    without = draw_jobs(seed=3, job_days=20)

    slurm = [j for j in jobs if j.platform is Platform.SLURM]
    assert jobs[: len(without)] == without
    assert slurm == jobs[len(without) :]
    assert sum(j.days for j in slurm) >= 20 * 0.2
    assert all(SLURM.names_job(j.name) for j in slurm)
    assert len({j.name for j in jobs}) == len(jobs)


def test_a_slurm_job_is_laid_out_as_on_parallelcluster() -> None:
    # Given a 4-node Slurm job whose CloudWatch agent publishes power
    slurm = slurm_job("layout", hosts=4, agent=False)
    # When simulated
    header, events = simulate(slurm)
    events = list(events)
    # Then its hosts are nodes, each an instance whose CloudWatch agent metrics carry its id, and each node writes its
    # own stream of the job
    nodes = header.job.instance_ids
    assert header.job.platform is Platform.SLURM
    assert not any(n.startswith("i-") for n in nodes)
    assert sorted(header.job.host_instances or {}) == sorted(nodes)
    metrics = {e.metric.dimensions.get(contract.CWAGENT_DIM_INSTANCE) for e in events if isinstance(e, MetricEvent)}
    assert metrics - {None} == set((header.job.host_instances or {}).values())
    instances = header.job.host_instances or {}
    expected = {stream_name(instances[n], log_key("pcfm", "4242"), n) for n in nodes}
    assert {e.log.stream for e in events if isinstance(e, LogEvent)} == expected


STALLED = [
    slurm_job("crash-noagent", Fault("crash", "faulty GPU", 2 * HOUR, host=2), agent=False),
    slurm_job("hang-agent", Fault("hang", "network switch or cable", 2 * HOUR)),
    slurm_job("lost-noagent", Fault("lost", "host maintenance", 2 * HOUR, host=1), agent=False),
]


@pytest.mark.parametrize("stalled", STALLED, ids=[j.name for j in STALLED])
def test_a_slurm_jobs_fault_is_stopped_soon_after_its_onset(stalled: Job) -> None:
    outcome = faultmix.run_job(stalled)
    assert outcome.stop_s is not None
    assert not outcome.false_stop
    assert (outcome.stop_s - stalled.fault.onset_s) / 60 <= (15 if stalled.agent else 25)


def test_a_silent_hang_of_a_slurm_job_without_the_agent_or_power_is_stopped_within_45_minutes() -> None:
    hung = slurm_job("silent", Fault("hang", "NIC", 2 * HOUR), agent=False, ec2_power=False, nccl_timeout_s=7200.0)
    outcome = faultmix.run_job(hung)
    assert outcome.stop_s is not None
    assert 0 <= (outcome.stop_s - 2 * HOUR) / 60 <= 45
    assert outcome.stop_diagnosis == "hang"


def test_a_healthy_slurm_job_through_its_pauses_is_never_stopped_or_warned() -> None:
    pauses = (
        Episode("checkpoint", 1 * HOUR, 1500.0, start_line=True, end_line=False),
        Episode("eval", 2.5 * HOUR, 1500.0, start_line=False),
        Episode("data_stall", 3.3 * HOUR, 900.0, start_line=False),
        Episode("restart", 4.0 * HOUR, 480.0, host=2),
    )
    outcome = faultmix.run_job(slurm_job("healthy", episodes=pauses, agent=False, rank0_only_logs=True))
    assert outcome.stop_s is None
    assert outcome.warnings_healthy == 0
