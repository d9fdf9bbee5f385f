"""The real Slurm the Slurm platform is tested on (localrun/slurm_daemons.py): its daemons start in their own folder,
run a 2-node job and cancel it, and stop, leaving nothing (draining and requeueing: test_slurm_deploy.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from localrun.slurm_daemons import SlurmDaemons, SlurmError, parse_fields
from tests.fixtures.slurm import DEADLINE_S

pytestmark = pytest.mark.slow


def _running(slurm: SlurmDaemons, args: list[str], task: str, tasks: int) -> tuple[str, dict[str, str]]:
    """A job running with its tasks started (one cancelled while srun launches them holds its nodes longer)."""
    job = slurm.sbatch([*args, "--wrap", f"srun {task}"])
    fields = slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)
    slurm.wait_for_tasks(task, tasks, DEADLINE_S)
    return job, fields


def test_a_two_node_job_runs_one_rank_per_node(slurm: SlurmDaemons, tmp_path: Path) -> None:
    """Given three idle nodes, when a 2-node job runs `srun`, then each rank sees its own node and the job's id."""
    out = tmp_path / "ranks-%j.out"
    script = "srun sh -c 'echo \"$SLURM_PROCID $SLURMD_NODENAME $SLURM_JOB_ID $SLURM_JOB_NAME\"'"
    job = slurm.sbatch(["--nodes=2", "--job-name=ranks", f"--output={out}", "--wrap", script])
    fields = slurm.wait_for(job, {"COMPLETED", "FAILED"}, DEADLINE_S)

    assert fields["JobState"] == "COMPLETED"
    lines = sorted(Path(str(out).replace("%j", job)).read_text().split("\n"))[1:]
    assert [line.split() for line in lines] == [["0", "node1", job, "ranks"], ["1", "node2", job, "ranks"]]


def test_scancel_ends_the_job_cancelled(slurm: SlurmDaemons) -> None:
    job, _ = _running(slurm, ["--nodes=2"], "sleep 300", 2)

    slurm.command("scancel", job)

    assert slurm.wait_for(job, {"CANCELLED"}, DEADLINE_S)["JobState"] == "CANCELLED"


def test_leaving_the_block_stops_every_daemon_and_what_its_jobs_still_ran(tmp_path: Path) -> None:
    """Two clusters at once on their own ports and sockets; leaving each block ends its daemons, and a job still
    running (slurmstepd and its tasks outlive slurmd) with them."""
    with SlurmDaemons(tmp_path / "a", nodes=1) as a, SlurmDaemons(tmp_path / "b", nodes=1) as b:
        pids = [int((d.root / "slurmctld.pid").read_text()) for d in (a, b)]
        assert a.node_state("node1") == b.node_state("node1") == "IDLE"
        job = a.sbatch(
            [f"--output={tmp_path / 'out.txt'}", "--wrap", f"srun sh -c 'echo $$ > {tmp_path / 'pid'}; sleep 600'"]
        )
        a.wait_for(job, {"RUNNING"}, DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        pids.append(int((tmp_path / "pid").read_text()))
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_failing_command_names_itself(slurm: SlurmDaemons) -> None:
    with pytest.raises(SlurmError, match="scontrol requeue 999999"):
        slurm.scontrol("requeue", "999999")


def test_fields_keep_values_with_spaces() -> None:
    line = "JobId=7 JobName=t Comment=stallwatch:mode=enforce stallwatch:stall-minutes=5 SubmitTime=2026-01-02T03:04"

    fields = parse_fields(line)

    assert fields["Comment"] == "stallwatch:mode=enforce stallwatch:stall-minutes=5"
    assert fields["SubmitTime"] == "2026-01-02T03:04"
