"""Where this process stands in its job, from whichever launcher started it, and the process group it joins.

    placement = Placement.from_environment()   # torchrun (SageMaker's torch_distributed runs it), srun, mpirun
    device = placement.start()                 # init_process_group when there is a group; the device to train on

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Slurm's srun sets SLURM_PROCID,
SLURM_STEP_NUM_TASKS and SLURM_LOCALID; the rendezvous is MASTER_ADDR when the batch script exports it, else the
node srun was launched from (SLURM_LAUNCH_NODE_IPADDR). mpirun sets OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK (Open
MPI) or PMI_RANK, PMI_SIZE and MPI_LOCALRANKID (MPICH, Intel MPI); pass MASTER_ADDR (and MASTER_PORT) with it
(`mpirun -x MASTER_ADDR=...`). A process given a rank without a rendezvous (RANK alone, as Stallwatch's local demo
runs one process per simulated host) trains alone under that rank. The group's backend is NCCL on GPUs, Gloo on CPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_PORT = 29500  # torch.distributed's default MASTER_PORT


class LauncherError(ValueError):
    """The launcher's environment names ranks but no way to meet."""


@dataclass(frozen=True)
class Placement:
    """This process's place in the job, and where the processes meet (None: no process group)."""

    launcher: str  # torchrun, srun, mpirun, or none
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int = DEFAULT_PORT

    @property
    def distributed(self) -> bool:
        return self.master_addr is not None and self.world_size > 1

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> Placement:
        """The first launcher whose variables are set: torchrun, srun, mpirun; else one process."""
        port = int(env.get("MASTER_PORT", DEFAULT_PORT))
        if "RANK" in env and "MASTER_ADDR" in env:
            return cls("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK", 0),
                       env["MASTER_ADDR"], port)  # fmt: skip
        if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
            master = env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR")
            return cls("srun", _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS"),
                       _int(env, "SLURM_LOCALID", 0), master, port)  # fmt: skip
        for rank, size, local in (
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
            ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ):
            if rank in env and size in env:
                placement = cls("mpirun", _int(env, rank), _int(env, size), _int(env, local, 0),
                                env.get("MASTER_ADDR"), port)  # fmt: skip
                if placement.world_size > 1 and placement.master_addr is None:
                    raise LauncherError("mpirun: pass the rendezvous too, e.g. mpirun -x MASTER_ADDR=<rank 0's host>")
                return placement
        return cls("none", _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1), _int(env, "LOCAL_RANK", 0))

    def start(self) -> torch.device:
        """Join the process group (when there is one) and return the device to train on: this process's GPU, else
        the CPU. RANK, WORLD_SIZE and LOCAL_RANK are set for libraries that read them (the trainer agent)."""
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", self.local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank))
        if self.distributed:
            os.environ.update(MASTER_ADDR=str(self.master_addr), MASTER_PORT=str(self.master_port))
            dist.init_process_group(
                "nccl" if cuda else "gloo", init_method="env://", rank=self.rank, world_size=self.world_size
            )
        return device

    def stop(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    if name not in env and default is not None:
        return default
    try:
        return int(env[name])
    except (KeyError, ValueError) as exc:
        raise LauncherError(f"{name}={env.get(name)!r}: expected a number") from exc
