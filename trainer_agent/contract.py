"""The metric contract between the agent, the control plane and the dashboards.

One definition on the agent side; ``lambdas/stallwatch/contract.py`` mirrors it and
``tests/test_contract.py`` checks that the two agree.
"""

from __future__ import annotations

import hashlib
import re

NAMESPACE = "Stallwatch"
DIM_JOB = "JobName"
DIM_HOST = "Host"

# Per window, emitted by global rank 0 with dimension JobName: name -> CloudWatch unit.
JOB_METRICS: dict[str, str] = {
    "Steps": "Count",
    "Step": "None",
    "LastStepAge": "Seconds",
    "StepTime": "Seconds",
    "TokensPerSecond": "Count/Second",
    "SamplesPerSecond": "Count/Second",
    "TFLOPsPerAccelerator": "None",
    "TFLOPsPerGPU": "None",
    "MFU": "Percent",
    "DataWaitFraction": "Percent",
    "Loss": "None",
    "NonFiniteLoss": "Count",
    "PhaseBudgetRemaining": "Seconds",
    "ETA": "Seconds",
}

# Per window, emitted by one process per host with dimensions JobName and Host: liveness, not progress. An accelerator
# is a GPU or a NeuronCore; a NeuronCore's power is a percentage of its device's maximum (the Neuron driver gives no
# watts), its utilization and memory are neuron-monitor's.
HOST_METRICS: dict[str, str] = {
    "Heartbeat": "Count",
    "AcceleratorPowerWatts": "None",
    "AcceleratorPowerPercent": "Percent",
    "AcceleratorUtilization": "Percent",
    "AcceleratorMemoryUtilization": "Percent",
    "GPUPowerWatts": "None",
    "GPUUtilization": "Percent",
    "GPUMemoryUtilization": "Percent",
    "StepTime": "Seconds",
}

# Renamed for accelerators that are not GPUs (old name -> new name). For one release the agent still emits the old name
# beside the new one where the device is a GPU, and the control plane reads the old name from an older agent.
RENAMED_METRICS: dict[str, str] = {
    "TFLOPsPerGPU": "TFLOPsPerAccelerator",
    "GPUPowerWatts": "AcceleratorPowerWatts",
    "GPUUtilization": "AcceleratorUtilization",
    "GPUMemoryUtilization": "AcceleratorMemoryUtilization",
}

# The scopes a window is emitted for: job metrics from global rank 0, host metrics from one process per host.
SCOPE_JOB = "job"
SCOPE_HOST = "host"

# CloudWatch's high-resolution storage (1 s) is used when the agent emits more often than once a minute.
HIGH_RESOLUTION_S = 1
STANDARD_RESOLUTION_S = 60

# Where the job name and host come from, in order of preference (after an explicit argument); then, on EC2, the
# instance's JOB_TAG (instance metadata) and its instance id.
JOB_NAME_ENV = "STALLWATCH_JOB_NAME"
SAGEMAKER_JOB_NAME_ENV = "TRAINING_JOB_NAME"  # set by SageMaker in a training job: the name the control plane reads
JOB_TAG = "stallwatch:job"
HOST_ENV = "SM_CURRENT_HOST"
# In a Slurm job (srun's tasks): the job is named from the cluster, the id and the name (`slurm_job_name`), as the
# control plane names it from deploy/slurm's event; the host is the Slurm node.
SLURM_JOB_ID_ENV = "SLURM_JOB_ID"
SLURM_JOB_NAME_ENV = "SLURM_JOB_NAME"
SLURM_CLUSTER_ENV = "SLURM_CLUSTER_NAME"
SLURM_NODE_ENV = "SLURMD_NODENAME"
SLURM_NAME_MAX = 63  # a job name becomes alarm names and the JobName dimension, as SageMaker's (63 at most)
SLURM_NAME_HASH_CHARS = 12  # a hashed name's hash (the control plane's core.names.HASH_CHARS)
SLURM_HASHED_HEAD_MAX = 30  # a hashed name's first characters of the cluster


def slurm_job_name(cluster: str, job_id: str, name: str) -> str:
    """A Slurm job's JobName, as the control plane names it (`stallwatch.core.platforms.slurm.slurm_job_name`, unique
    by construction for its cluster and id): ``<cluster>-<id>-<name>`` (every byte but letters, digits, '-' and '_'
    made '-'; ``slurm_job_name("pc1", "42", "llm 7b") == "pc1-42-llm-7b"``) where the cluster has no '-' and the
    whole fits 63, else ``<cluster start>--<hash>-<id>-<name>`` cut to 63 with its hash whole."""
    cluster = cluster or "slurm"
    joined = "-".join(part for part in (cluster, job_id, name) if part).encode()
    plain = "".join(chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "-_") else "-" for b in joined)
    if re.match(r"^[A-Za-z0-9_]+\Z", cluster) and len(plain) <= SLURM_NAME_MAX:
        return plain
    digest = hashlib.sha256("\0".join((cluster, job_id, name)).encode()).hexdigest()[:SLURM_NAME_HASH_CHARS]
    head, _, rest = plain.partition("-")
    return f"{head[:SLURM_HASHED_HEAD_MAX]}--{digest}-{rest}"[:SLURM_NAME_MAX].rstrip("-")


# The stack dump (trainer_agent.stack_dumps): one JSON line per rank and stall whose first key is this marker, the
# term the control plane's log filter asks CloudWatch Logs for; its value is the line's format version.
STACKS_MARKER = "StallwatchStacks"
STACKS_VERSION = 1
# What a decision reads of one stall's dumps (three FilterLogEvents pages of 1 MB, less each event's overhead): each
# rank's line is kept within this over the world size, so every rank's is read.
STACKS_READ_BYTES = 2_800_000
