"""The real Slurm the Slurm platform is tested on (localrun/slurm_daemons.py): its daemons start in their own folder,
run a 2-node job and cancel it, and stop, leaving nothing (draining and requeueing: test_slurm_deploy.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localrun.slurm_daemons import SlurmDaemons, SlurmError, parse_fields

pytestmark = pytest.mark.slow
RUN_S = 90.0  # generous: a busy CI machine; a quiet one takes seconds


def _running(slurm: SlurmDaemons, args: list[str]) -> tuple[str, dict[str, str]]:
    job = slurm.sbatch(args)
    return job, slurm.wait_for(job, {"RUNNING"}, RUN_S)


def test_a_two_node_job_runs_one_rank_per_node(slurm: SlurmDaemons, tmp_path: Path) -> None:
    """Given three idle nodes, when a 2-node job runs `srun`, then each rank sees its own node and the job's id."""
    out = tmp_path / "ranks-%j.out"
    script = "srun sh -c 'echo \"$SLURM_PROCID $SLURMD_NODENAME $SLURM_JOB_ID $SLURM_JOB_NAME\"'"
    job = slurm.sbatch(["--nodes=2", "--job-name=ranks", f"--output={out}", "--wrap", script])
    fields = slurm.wait_for(job, {"COMPLETED", "FAILED"}, RUN_S)

    assert fields["JobState"] == "COMPLETED"
    lines = sorted(Path(str(out).replace("%j", job)).read_text().split("\n"))[1:]
    assert [line.split() for line in lines] == [["0", "node1", job, "ranks"], ["1", "node2", job, "ranks"]]


def test_scancel_ends_the_job_cancelled(slurm: SlurmDaemons) -> None:
    job, _ = _running(slurm, ["--nodes=2", "--wrap", "srun sleep 300"])

    slurm.command("scancel", job)

    assert slurm.wait_for(job, {"CANCELLED"}, RUN_S)["JobState"] == "CANCELLED"


def test_leaving_the_block_stops_every_daemon(tmp_path: Path) -> None:
    """Two clusters at once on their own ports and sockets; leaving each block ends its daemons."""
    with SlurmDaemons(tmp_path / "a", nodes=1) as a, SlurmDaemons(tmp_path / "b", nodes=1) as b:
        pids = [int((d.root / "slurmctld.pid").read_text()) for d in (a, b)]
        assert a.node_state("node1") == b.node_state("node1") == "IDLE"
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
