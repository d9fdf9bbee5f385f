"""Who this process is: job name, host, global/local rank and world size, found without collectives.

ident = Identity.detect()          # SageMaker, torchrun on EC2, plain python all work
ident.reports_job, ident.reports_host

The job name: in a SageMaker training job, always SageMaker's ``TRAINING_JOB_NAME`` (the name the control plane
reads, and a resumed ``-r1`` gets its own); a differing ``STALLWATCH_JOB_NAME`` or ``job_name`` is logged once and
not used. Elsewhere, first found: the given ``job_name``; ``STALLWATCH_JOB_NAME``; in a Slurm job, the name
``<cluster>-<SLURM_JOB_ID>-<SLURM_JOB_NAME>`` (`contract.slurm_job_name`); on EC2 the instance's
``stallwatch:job`` tag (instance metadata, when tags in metadata are enabled); the EC2 instance id (a one-instance
job, as the control plane names it); the hostname. The host: SageMaker's ``SM_CURRENT_HOST``, else the Slurm node
(``SLURMD_NODENAME``), else the EC2 instance id, else the hostname. The ranks: torch.distributed's once initialised,
else the first launcher's of `LAUNCHERS` whose rank is set (torchrun's ``RANK``, Open MPI's, MVAPICH2's, Hydra's
``PMI_RANK``, srun's ``SLURM_PROCID``: rank 0 is task 0), else Lightning's node and local ranks.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trainer_agent.contract import (
    HOST_ENV,
    JOB_NAME_ENV,
    JOB_TAG,
    SAGEMAKER_JOB_NAME_ENV,
    SLURM_CLUSTER_ENV,
    SLURM_JOB_ID_ENV,
    SLURM_JOB_NAME_ENV,
    SLURM_NODE_ENV,
    slurm_job_name,
)
from trainer_agent.log import warn_once

# On Nitro instances the DMI board asset tag holds the instance id: a file read, no network.
DMI_DIR = Path("/sys/devices/virtual/dmi/id")
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
IMDS_URL = "http://169.254.169.254/latest"
IMDS_TIMEOUT_S = 0.3
IMDS_TOKEN_TTL_S = "60"
# Launchers' (rank, world size, local rank) variables; the first launcher whose rank is set names all three (a
# launcher started by another, torchrun under srun, sets its own): torchrun and torch elastic (also DeepSpeed's
# launcher, accelerate, SageMaker's torch_distributed), Open MPI's mpirun, MVAPICH2, MPICH and Intel MPI (Hydra's
# PMI), Slurm's srun.
LAUNCHERS: tuple[tuple[str, str, str], ...] = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)
# Lightning's own launcher sets no global rank: its node's, the local one, and per node (LOCAL_WORLD_SIZE) if known.
NODE_RANK_ENV, LOCAL_WORLD_SIZE_ENV = "NODE_RANK", "LOCAL_WORLD_SIZE"
RANK_ENV = tuple(rank for rank, _, _ in LAUNCHERS)
WORLD_SIZE_ENV = tuple(size for _, size, _ in LAUNCHERS)
LOCAL_RANK_ENV = tuple(local for _, _, local in LAUNCHERS)


@dataclass(frozen=True)
class Identity:
    """The process's place in the job."""

    job: str
    """Job name: the JobName dimension."""
    host: str
    """Host name: the Host dimension (SM_CURRENT_HOST, else EC2 instance id, else hostname)."""
    rank: int
    """Global rank."""
    world_size: int
    """Number of processes in the job."""
    local_rank: int
    """Rank on this host."""

    def __post_init__(self) -> None:
        if not self.job:
            raise ValueError("job name is empty")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not within world_size {self.world_size}")
        if self.local_rank < 0:
            raise ValueError(f"local_rank {self.local_rank} is negative")

    @property
    def reports_job(self) -> bool:
        """Global rank 0 emits the job's metrics."""
        return self.rank == 0

    @property
    def reports_host(self) -> bool:
        """Local rank 0 emits its host's metrics."""
        return self.local_rank == 0

    @classmethod
    def detect(cls, job_name: str | None = None) -> Identity:
        """Read the identity from torch.distributed (when initialised), else RANK/WORLD_SIZE/LOCAL_RANK."""
        rank, world_size, local_rank = _ranks()
        return cls(job=_job_name(job_name), host=_host(), rank=rank, world_size=world_size, local_rank=local_rank)


def _job_name(given: str | None) -> str:
    chosen = given or os.environ.get(JOB_NAME_ENV)
    platform = os.environ.get(SAGEMAKER_JOB_NAME_ENV)
    if platform:
        if chosen and chosen != platform:
            source = "job_name" if given else JOB_NAME_ENV
            warn_once(
                "identity:job-name",
                "%s=%r is not this SageMaker training job's name: metrics go to %s=%r, the name Stallwatch reads",
                source,
                chosen,
                SAGEMAKER_JOB_NAME_ENV,
                platform,
            )
        return platform
    return chosen or _slurm_job() or ec2_job_tag() or ec2_instance_id() or socket.gethostname()


def _slurm_job() -> str | None:
    """In a Slurm job, its name as the control plane gives it (`contract.slurm_job_name`); else None."""
    job_id = os.environ.get(SLURM_JOB_ID_ENV)
    if not job_id:
        return None
    return slurm_job_name(os.environ.get(SLURM_CLUSTER_ENV, ""), job_id, os.environ.get(SLURM_JOB_NAME_ENV, ""))


def _ranks() -> tuple[int, int, int]:
    rank, world_size, local_rank = _launcher_ranks()
    # Only consult torch.distributed if the script imported torch: it cannot be initialised otherwise.
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return rank, world_size, rank if local_rank is None else local_rank


def _launcher_ranks() -> tuple[int, int, int | None]:
    """(rank, world size, local rank or None) from the first launcher whose rank is set, else from Lightning's node
    and local ranks, else a single process's."""
    for rank_name, size_name, local_name in LAUNCHERS:
        rank = _env_int((rank_name,))
        if rank is not None:
            return rank, _env_int((size_name,)) or 1, _env_int((local_name, "LOCAL_RANK"))
    local, node = _env_int(("LOCAL_RANK",)), _env_int((NODE_RANK_ENV,)) or 0
    # Node 0's ranks are exact; another node's, without LOCAL_WORLD_SIZE, are at least not 0 (torch.distributed's
    # rank replaces them once it is initialized).
    rank = node * (_env_int((LOCAL_WORLD_SIZE_ENV,)) or (local or 0) + 1) + (local or 0)
    return rank, max(_env_int(("WORLD_SIZE",)) or 1, rank + 1), local


def _env_int(names: tuple[str, ...]) -> int | None:
    """The first of the variables that is set, as an integer (a `ValueError` names one that is not)."""
    for name in names:
        value = os.environ.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    return None


def _host() -> str:
    return os.environ.get(HOST_ENV) or os.environ.get(SLURM_NODE_ENV) or ec2_instance_id() or socket.gethostname()


def ec2_instance_id(dmi_dir: Path | None = None) -> str | None:
    """The EC2 instance id, or None off EC2. Never waits more than ~2 x IMDS_TIMEOUT_S, and only on EC2 hardware."""
    dmi_dir = dmi_dir or DMI_DIR
    asset_tag = _read(dmi_dir / "board_asset_tag")
    if INSTANCE_ID.match(asset_tag):
        return asset_tag
    instance_id = (_imds("meta-data/instance-id", dmi_dir) or "").strip()
    return instance_id if INSTANCE_ID.match(instance_id) else None


def ec2_job_tag(dmi_dir: Path | None = None) -> str | None:
    """The instance's `stallwatch:job` tag from instance metadata, or None: off EC2, tag absent, or tags in
    metadata not enabled (the launch option ``InstanceMetadataTags=enabled``)."""
    value = (_imds(f"meta-data/tags/instance/{JOB_TAG}", dmi_dir or DMI_DIR) or "").strip()
    return value or None


def _on_ec2(dmi_dir: Path) -> bool:
    """EC2 hardware (a file read, no network), and instance metadata not disabled."""
    vendor = _read(dmi_dir / "sys_vendor").lower()
    on_ec2 = "amazon" in vendor or INSTANCE_ID.match(_read(dmi_dir / "board_asset_tag")) is not None
    return on_ec2 and os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true"


def _imds(path: str, dmi_dir: Path) -> str | None:
    """GET an instance-metadata path with an IMDSv2 token; None off EC2, on any error or after the timeouts."""
    if not _on_ec2(dmi_dir):
        return None
    try:
        token_request = urllib.request.Request(
            f"{IMDS_URL}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": IMDS_TOKEN_TTL_S}
        )
        with urllib.request.urlopen(token_request, timeout=IMDS_TIMEOUT_S) as response:
            token = response.read().decode()
        request = urllib.request.Request(f"{IMDS_URL}/{path}", headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
            return response.read().decode()
    except OSError:  # includes HTTPError 404: the tag is absent or tags are not in metadata
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
