"""`stallwatch doctor` on a deployment that watches Slurm: the job events' rule (on the stack's Slurm bus) and log
group, each cluster's runner answering a ping through the table, a running Slurm job heard of."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stallwatch.aws.platforms import slurm_doctor
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs
from stallwatch.core.platforms.slurm import SlurmJob, SlurmNode
from stallwatch.offline import doctor
from stallwatch.offline.ops import Deployment
from tests.fixtures.slurm import HYPERPOD_TARGET, FakeRunner
from tests.fixtures.templates import synthesized
from tests.offline.test_doctor import STACK, deployed, slack  # noqa: F401 - the deployment on moto
from tests.stacks.conftest import SLURM_WATCHED

SUBMIT = "2026-12-01T10:00:00"


@pytest.fixture(autouse=True)
def _short_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_doctor, "RUNNER_PING_WAIT_S", 2.0)
    monkeypatch.setattr(slurm_doctor, "RUNNER_PING_POLL_S", 0.1)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A deployment that watches Slurm (`platforms.slurm.monitor`), synthesized as `cdk synth` does (offline)."""
    return synthesized(tmp_path_factory, "slurm", stallwatch=SLURM_WATCHED)


pytestmark = pytest.mark.slow


def _checks() -> dict[str, doctor.Check]:
    return {c.name: c for c in doctor.run_checks(Deployment(stack=STACK)) if "Slurm" in c.name}


def _running(cluster: str, target: str = "") -> None:
    """A running job of `cluster` whose start was heard (the stack's table)."""
    job = SlurmJob(
        cluster,
        "7",
        "llm",
        SUBMIT,
        1_796_000_000,
        1_796_000_060.0,
        "RUNNING",
        nodes=(SlurmNode("n1"),),
        ssm_target=target,
    )
    SlurmJobs(Deployment(stack=STACK).store()).start(job, 1.0)


@pytest.fixture
def answering(tmp_path: Path) -> Iterator[FakeRunner]:
    """Cluster pc1's runner, answering what waits for it every 0.1 s while the test runs."""
    runner = FakeRunner(tmp_path / "pc1", Deployment(stack=STACK).store(), "pc1", {})
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.1):
            runner.poll()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield runner
    stop.set()
    thread.join()


def test_a_slurm_deployment_without_runners_or_jobs_is_warned_and_its_resources_pass(deployed: Any) -> None:  # noqa: F811
    checks = _checks()
    assert checks["Slurm job events rule"].status is doctor.Status.OK
    assert checks["Slurm log group"].status is doctor.Status.OK
    assert (checks["Slurm runners"].status, checks["Slurm job events"].status) == (doctor.Status.WARN,) * 2
    assert "stallwatch-runner" in checks["Slurm runners"].fix
    assert "journalctl -t stallwatch-slurm" in checks["Slurm job events"].fix


def test_a_hyperpod_jobs_cluster_whose_runner_does_not_answer_fails_the_doctor(deployed: Any) -> None:  # noqa: F811
    # Given a running job of a HyperPod cluster (its target HyperPod's SSM name), and no runner polling for it
    _running("hp1", HYPERPOD_TARGET)
    # When the doctor runs
    checks = _checks()
    # Then the cluster's runner fails the doctor by name: no job of it can be stopped
    assert checks["Slurm runner hp1"].status is doctor.Status.FAIL
    assert "did not answer" in checks["Slurm runner hp1"].detail
    assert checks["Slurm job events"].status is doctor.Status.OK


def test_a_runner_that_answers_passes(deployed: Any, answering: FakeRunner) -> None:  # noqa: F811
    _running("pc1")
    checks = _checks()
    assert checks["Slurm runner pc1"].status is doctor.Status.OK
    assert any(call[:2] == ["scontrol", "--version"] for call in answering.world()["calls"])
