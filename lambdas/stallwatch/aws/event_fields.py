"""What every event model shares (`aws.events`, and each platform's `aws/platforms/<name>_events.py`): the pydantic
base and AWS's own limits, enforced at parse time so an oversized field never reaches a read or a DynamoDB key."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

TAGS_MAX = 50  # tags per resource
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256
EPOCH_MAX = 32_503_680_000.0  # 3000-01-01 UTC: any later epoch is not a time an event or the engine gives


class EventFields(BaseModel):
    """An event's model: its fields by their AWS names (aliases) or ours; fields it does not read are ignored."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
