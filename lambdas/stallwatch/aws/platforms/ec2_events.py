"""EC2's state-change event: EventBridge's "EC2 Instance State-change Notification" of one instance."""

from __future__ import annotations

from typing import Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import Field

from stallwatch.aws.event_fields import EventFields

EC2_INSTANCE_ID = r"^i-[0-9a-f]{8,17}$"


class InstanceStateDetail(EventFields):
    instance_id: str = Field(alias="instance-id", pattern=EC2_INSTANCE_ID)
    state: Literal["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


class InstanceStateChange(EventBridgeModel):
    source: Literal["aws.ec2"]
    detail_type: Literal["EC2 Instance State-change Notification"] = Field(alias="detail-type")
    detail: InstanceStateDetail
