"""examples/train_gpt.py as a multi-process job: the process group from the launcher's environment, DDP, and one
checkpoint written by global rank 0 alone, atomically, from which every rank resumes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import boto3
import moto
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))  # the example's modules import each other as SageMaker's source_dir runs them

from checkpoints import LocalCheckpoints, checkpoint_store  # noqa: E402
from distributed import LauncherError, Placement  # noqa: E402
from train_gpt import parse_args  # noqa: E402

TORCHRUN_TIMEOUT_S = 240


pytestmark = pytest.mark.slow


def _torchrun(checkpoints: Path, steps: int) -> subprocess.CompletedProcess[str]:
    """2 processes on this machine's CPU (Gloo), the checkpoint location given as the EC2 unit gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STALLWATCH_", "RANK", "WORLD_SIZE"))}
    env |= {"STALLWATCH_CHECKPOINT_URI": str(checkpoints), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(EXAMPLES / "train_gpt.py"), "--steps", str(steps), "--checkpoint-every", "2", "--interval", "60",
        "--batch-size", "2",
    ]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S, check=False)


def test_two_ranks_train_write_one_checkpoint_and_both_resume_from_it(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"

    # When torchrun starts 2 processes for 4 steps, checkpointing every 2
    first = _torchrun(checkpoints, steps=4)
    assert first.returncode == 0, first.stderr[-3000:]

    # Then both joined one process group of 2 and trained to step 4
    for rank in (0, 1):
        assert f"rank {rank} of 2 (torchrun) on cpu, from step 0" in first.stdout
        assert f"rank {rank} done at step 4" in first.stdout
    # And one checkpoint was written, by rank 0 alone (its lines say so), with nothing left half-written
    assert [p.name for p in checkpoints.iterdir()] == ["checkpoint.pt"]
    assert re.findall(r"checkpoint at step (\d+)", first.stdout) == ["2", "4"]
    assert torch.load(checkpoints / "checkpoint.pt", weights_only=True)["step"] == 4

    # When the run is started again for 6 steps, Then every rank resumes from the checkpoint's step
    second = _torchrun(checkpoints, steps=6)
    assert second.returncode == 0, second.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} of 2 (torchrun) on cpu, from step 4" in second.stdout
        assert f"rank {rank} done at step 6" in second.stdout
    assert second.stdout.count("resumed from checkpoint at step 4") == 2
    assert torch.load(checkpoints / "checkpoint.pt", weights_only=True)["step"] == 6


def test_saves_at_once_never_collide_and_leave_a_whole_checkpoint(tmp_path: Path) -> None:
    # Given 8 saves at once into one folder (what 8 ranks of a host each saving would do)
    store = LocalCheckpoints(tmp_path)
    errors: list[BaseException] = []

    def save(step: int) -> None:
        try:
            store.save({"step": step, "weights": torch.full((256, 256), float(step))})
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(step,)) for step in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then none failed, no temporary file is left, and the checkpoint is one save's, whole
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    saved = store.load()
    assert saved is not None
    assert torch.equal(saved["weights"], torch.full((256, 256), float(saved["step"])))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # torchrun, and SageMaker's torch_distributed (which runs torchrun on each host)
        (
            {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "MASTER_ADDR": "algo-1", "MASTER_PORT": "7777"},
            Placement("torchrun", 9, 16, 1, "algo-1", 7777),
        ),
        # srun: the batch script's MASTER_ADDR, else the node srun was launched from
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_STEP_NUM_TASKS": "8",
                "SLURM_LOCALID": "1",
                "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7",
            },
            Placement("srun", 5, 8, 1, "10.0.0.7", 29500),
        ),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_LOCALID": "0",
                "MASTER_ADDR": "node-1",
                "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7",
            },
            Placement("srun", 0, 2, 0, "node-1", 29500),
        ),
        # mpirun: Open MPI, then MPICH and Intel MPI
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "MASTER_ADDR": "h0",
            },
            Placement("mpirun", 3, 4, 1, "h0", 29500),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MASTER_ADDR": "h0"},
            Placement("mpirun", 2, 4, 0, "h0", 29500),
        ),
        # a batch script itself (no srun step), and a process given a rank alone (the local demo): no group
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, Placement("none")),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, Placement("none", 1, 2, 0)),
        ({}, Placement("none")),
    ],
    ids=["torchrun", "srun", "srun-master", "openmpi", "mpich", "sbatch", "rank-alone", "plain"],
)
def test_the_placement_is_read_from_whichever_launcher_started_the_process(
    env: dict[str, str], expected: Placement
) -> None:
    placement = Placement.from_environment(env)
    assert placement == expected
    assert placement.distributed is (expected.master_addr is not None and expected.world_size > 1)


def test_mpirun_without_a_rendezvous_says_how_to_give_one() -> None:
    with pytest.raises(LauncherError, match="mpirun -x MASTER_ADDR"):
        Placement.from_environment({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})


def test_the_checkpoint_location_is_a_folder_or_an_s3_prefix(tmp_path: Path) -> None:
    assert checkpoint_store(None) is None
    assert checkpoint_store("") is None
    folder = checkpoint_store(f"file://{tmp_path}")
    assert isinstance(folder, LocalCheckpoints)
    assert folder.path == tmp_path / "checkpoint.pt"


def test_an_s3_prefix_holds_the_checkpoint_under_it() -> None:
    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket="ckpt")
        store = checkpoint_store("s3://ckpt/runs/llm-70b/")
        assert store is not None
        assert store.load() is None  # a first run finds nothing
        store.save({"step": 7})
        assert store.load() == {"step": 7}
        assert [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt")["Contents"]] == [
            "runs/llm-70b/checkpoint.pt"
        ]


def test_a_hung_run_ends_at_its_max_minutes_and_the_default_bounds_every_run(tmp_path: Path) -> None:
    # Given the example hung at its second step, with a bound of 30 seconds
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STALLWATCH_", "RANK", "WORLD_SIZE"))}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, str(EXAMPLES / "train_gpt.py"), "--steps", "0", "--fault", "hang", "--fault-after", "2",
        "--interval", "60", "--batch-size", "2", "--max-minutes", "0.5",
    ]  # fmt: skip

    # When it runs
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S, check=False)

    # Then it ends cleanly at its bound, the agent's last window flushed, as a stop would end it
    assert ran.returncode == 0, ran.stderr
    assert "fault hang at step 2" in ran.stdout
    assert "--max-minutes reached" in ran.stderr
    # ...and a run given no bound has one: an hour
    assert parse_args([]).max_minutes == 60
