"""Slurm's state-change events: deploy/slurm's "Slurm Job State Change" (source `stallwatch.slurm`, on the stack's
Slurm event bus), one per job start and end, as deploy/slurm/stallwatch-events.sh writes it (docs/deploy.md, "Slurm
clusters"); and SageMaker HyperPod's "SageMaker HyperPod Cluster Node Health Event" (source `aws.sagemaker`), which
says what HyperPod does about a node (`core.platforms.hyperpod.health_event`)."""

from __future__ import annotations

from typing import Annotated, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import Field, field_validator, model_validator

from stallwatch.aws.event_fields import EPOCH_MAX, TAG_VALUE_MAX, EventFields
from stallwatch.core.platforms.slurm import time_limit_seconds

# What the script writes (its strings at most 512 bytes, at most 2,000 nodes).
SLURM_TEXT_MAX = 512
SLURM_NODES_MAX = 2000
SLURM_TIME = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$"  # as Slurm prints it, the controller's local time
SLURM_NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# The controller's SSM name: its EC2 instance (ParallelCluster, PCS), or HyperPod's sagemaker-cluster:<cluster id>_
# <group>-<instance id> (`core.platforms.slurm.HYPERPOD_TARGET`); none: the nodes are not matched to instances.
SSM_TARGET = r"^(i-[0-9a-f]{8,17}|sagemaker-cluster:[a-z0-9]{12}_[A-Za-z0-9](-*[A-Za-z0-9]){0,62}-i-[0-9a-f]{8,17})?$"
HYPERPOD_NODE_HEALTH = "SageMaker HyperPod Cluster Node Health Event"
INSTANCE_ID = r"^i-[0-9a-z]{8,17}$"  # the docs' own example is not hex
SETTINGS_MAX = 50  # as a resource's tags


class SlurmNodeDetail(EventFields):
    """One node of a Slurm job, as the prolog names it: its Slurm name, its NodeAddr, its GPUs (Gres)."""

    name: str = Field(pattern=SLURM_NODE_NAME)
    addr: str = Field("", max_length=SLURM_TEXT_MAX)
    gpus: int = Field(0, ge=0, le=1024)


class SlurmJobDetail(EventFields):
    """The `detail` of deploy/slurm's "Slurm Job State Change" (docs/deploy.md, "Slurm clusters")."""

    version: Literal[1]
    state: Literal["started", "ended"]
    cluster: str = Field(min_length=1, max_length=SLURM_TEXT_MAX)
    platform: Literal["parallelcluster", "pcs", "hyperpod", "slurm"] = "slurm"
    ssm_target: str = Field("", pattern=SSM_TARGET)
    job_id: str = Field(pattern=r"^[0-9]{1,10}$")
    name: str = Field("", max_length=SLURM_TEXT_MAX)
    user: str = Field("", max_length=SLURM_TEXT_MAX)
    partition: str = Field("", max_length=SLURM_TEXT_MAX)
    submit_time: str = Field(pattern=SLURM_TIME)
    submit_epoch: int = Field(gt=0, lt=EPOCH_MAX)
    start_epoch: int = Field(0, ge=0, lt=EPOCH_MAX)
    job_state: str = Field("", pattern=r"^[A-Z_+]{0,32}$")
    time_limit: str = Field("", max_length=32)
    restarts: int = Field(0, ge=0, le=100_000)
    exit_code: str = Field("", max_length=32)
    reason: str = Field("", max_length=SLURM_TEXT_MAX)
    node_list: str = Field("", max_length=SLURM_TEXT_MAX)
    nodes: list[SlurmNodeDetail] = Field(default_factory=list, max_length=SLURM_NODES_MAX)
    settings: dict[
        Annotated[str, Field(pattern=r"^stallwatch:[a-z0-9-]{1,64}$")], Annotated[str, Field(max_length=TAG_VALUE_MAX)]
    ] = Field(default_factory=dict, max_length=SETTINGS_MAX)

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, value: str) -> str:
        time_limit_seconds(value)  # ValueError names it
        return value

    @model_validator(mode="after")
    def _started_on_nodes(self) -> SlurmJobDetail:
        if self.state == "started" and not self.nodes:
            raise ValueError("a started job names its nodes")
        return self


class SlurmJobStateChange(EventBridgeModel):
    source: Literal["stallwatch.slurm"]
    detail_type: Literal["Slurm Job State Change"] = Field(alias="detail-type")
    detail: SlurmJobDetail


class HealthSummary(EventFields):
    health_status: str = Field(alias="HealthStatus", max_length=64)
    health_status_reason: str = Field("", alias="HealthStatusReason", max_length=SLURM_TEXT_MAX)
    repair_action: str = Field("", alias="RepairAction", max_length=64)
    recommendation: str = Field("", alias="Recommendation", max_length=SLURM_TEXT_MAX)


class NodeHealthDetail(EventFields):
    """The `detail` of HyperPod's node health event (the AWS docs' example: corpus/aws_events/hyperpod)."""

    cluster_arn: str = Field(
        alias="ClusterArn", pattern=r"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:cluster/[a-z0-9-]{1,63}$"
    )
    instance_id: str = Field(alias="InstanceId", pattern=INSTANCE_ID)
    health_summary: HealthSummary = Field(alias="HealthSummary")


class HyperPodNodeHealth(EventBridgeModel):
    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker HyperPod Cluster Node Health Event"] = Field(alias="detail-type")
    detail: NodeHealthDetail


# What the Slurm platform reads: its jobs' starts and ends, and HyperPod's word on a node.
SlurmEvent = SlurmJobStateChange | HyperPodNodeHealth
