"""SageMaker's state-change event: EventBridge's "SageMaker Training Job State Change" of a training job (the fields
Stallwatch reads, with AWS's limits, so an oversized field never reaches a read or a DynamoDB key)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import Field, field_validator, model_validator

from stallwatch.aws.event_fields import TAG_KEY_MAX, TAG_VALUE_MAX, TAGS_MAX, EventFields

INSTANCE_TYPE_MAX = 64
MAX_INSTANCE_GROUPS = 20  # far above what a heterogeneous cluster may have; bounds the event's size
SAGEMAKER_JOB_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"


class InstanceGroup(EventFields):
    """One group of a heterogeneous cluster."""

    instance_group_name: str = Field(alias="InstanceGroupName", min_length=1, max_length=64)
    instance_type: str = Field(alias="InstanceType", min_length=1, max_length=INSTANCE_TYPE_MAX)
    instance_count: int = Field(alias="InstanceCount", ge=0, le=10_000)


class ResourceConfig(EventFields):
    """One instance type and count, or a heterogeneous cluster's `InstanceGroups`."""

    instance_type: str | None = Field(None, alias="InstanceType", min_length=1, max_length=INSTANCE_TYPE_MAX)
    instance_count: int | None = Field(None, alias="InstanceCount", ge=0, le=10_000)  # may be 0 beside InstanceGroups
    instance_groups: list[InstanceGroup] = Field(
        default_factory=list, alias="InstanceGroups", max_length=MAX_INSTANCE_GROUPS
    )

    @model_validator(mode="after")
    def _one_layout(self) -> ResourceConfig:
        if self.instance_groups:
            if not any(g.instance_count for g in self.instance_groups):
                raise ValueError("InstanceGroups: every group has InstanceCount 0")
        elif self.instance_type is None or not self.instance_count:
            raise ValueError("needs InstanceType and InstanceCount (at least 1), or InstanceGroups")
        return self


class TrainingJobDetail(EventFields):
    """The `detail` of a SageMaker training job state change (only the fields Stallwatch reads)."""

    training_job_name: str = Field(alias="TrainingJobName", pattern=SAGEMAKER_JOB_NAME, max_length=63)
    training_job_status: Literal["InProgress", "Completed", "Failed", "Stopping", "Stopped"] = Field(
        alias="TrainingJobStatus"
    )
    secondary_status: str | None = Field(None, alias="SecondaryStatus", max_length=64)
    resource_config: ResourceConfig = Field(alias="ResourceConfig")
    tags: dict[Annotated[str, Field(max_length=TAG_KEY_MAX)], Annotated[str, Field(max_length=TAG_VALUE_MAX)]] = Field(
        default_factory=dict, alias="Tags", max_length=TAGS_MAX
    )

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: Any) -> Any:
        # The event carries a map; the API's [{"Key", "Value"}] list is accepted too.
        if isinstance(value, list):
            return {item["Key"]: item["Value"] for item in value}
        return value or {}


class TrainingJobStateChange(EventBridgeModel):
    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker Training Job State Change"] = Field(alias="detail-type")
    detail: TrainingJobDetail
