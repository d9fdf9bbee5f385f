"""`stallwatch doctor` on a deployment that watches Slurm: the job events' rule, the Slurm documents and log group,
the controllers online in SSM, a running Slurm job heard of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from localrun import moto_ssm
from localrun.gpu_node import Agent
from localrun.slurm_daemons import ControllerNode
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs
from stallwatch.core.platforms.slurm import SlurmJob, SlurmNode
from stallwatch.offline import doctor
from stallwatch.offline.ops import Deployment
from tests.fixtures.world import EXAMPLE_AMI
from tests.offline.test_doctor import STACK, deployed, slack, template  # noqa: F401 - the deployment on moto

moto_ssm.install()


pytestmark = pytest.mark.slow


def _checks() -> dict[str, doctor.Check]:
    return {c.name: c for c in doctor.run_checks(Deployment(stack=STACK)) if "Slurm" in c.name}


def _controller(agent: Agent, tmp_path: Path) -> str:
    tags = [{"Key": "stallwatch:slurm", "Value": "controller"}]
    [instance] = boto3.client("ec2").run_instances(
        ImageId=EXAMPLE_AMI,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"]
    node = ControllerNode.__new__(ControllerNode)  # its daemons are not needed: the doctor only asks SSM about it
    node.agent = agent
    moto_ssm.manage(instance["InstanceId"], node)
    return str(instance["InstanceId"])


def test_a_slurm_deployment_without_controllers_or_jobs_is_warned_and_its_resources_pass(deployed: Any) -> None:  # noqa: F811
    checks = _checks()
    assert checks["Slurm job events rule"].status is doctor.Status.OK
    assert checks["Slurm document SLURM_CANCEL_DOCUMENT"].status is doctor.Status.OK
    assert checks["Slurm document SLURM_REQUEUE_DOCUMENT"].status is doctor.Status.OK
    assert checks["Slurm log group"].status is doctor.Status.OK
    assert (checks["Slurm controllers"].status, checks["Slurm job events"].status) == (doctor.Status.WARN,) * 2
    assert "stallwatch:slurm=controller" in checks["Slurm controllers"].fix
    assert "journalctl -t stallwatch-slurm" in checks["Slurm job events"].fix


def test_a_controller_ssm_cannot_reach_fails_and_a_heard_job_passes(deployed: Any, tmp_path: Path) -> None:  # noqa: F811
    # Given a controller online, another whose agent is gone, and a running job whose start was heard
    online, lost = _controller(Agent.ONLINE, tmp_path), _controller(Agent.OFFLINE, tmp_path)
    job = SlurmJob("pc1", "7", "llm", "2026-12-01T10:00:00", 1_796_000_000, 1_796_000_060.0, "RUNNING",
                   nodes=(SlurmNode("n1"),))  # fmt: skip
    SlurmJobs(Deployment(stack=STACK).store()).start(job, 1_796_000_060.0)  # the stack's table
    # When the doctor runs
    checks = _checks()
    # Then the lost controller fails the doctor by name, and the job is heard of
    assert checks["Slurm controllers"].status is doctor.Status.FAIL
    assert lost in checks["Slurm controllers"].detail
    assert online not in checks["Slurm controllers"].detail
    assert checks["Slurm job events"].status is doctor.Status.OK
    assert "pc1-7-llm" in checks["Slurm job events"].detail
    moto_ssm.reset()
