"""AWS Health's EventBridge event ("AWS Health Event", source `aws.health`) as on_health_event reads it: the event's
ARN, code, category, status, window and affected EC2 instances. corpus/aws_events/health/ quotes real ones, with their
sources; its README gives the fields' meanings (AWS Health's EventBridge schema).

    event = parse_event(raw, HealthEvent)          # aws.events.parse_event: InvalidEventError names the bad fields
    event.detail.scheduled                         # an EC2 scheduled change (the rule sends no other)
    event.instances()                              # the affected instance ids (affectedEntities, else resources)
    event.detail.window()                          # (start, end) in epoch seconds; end None where AWS gives none

AWS writes the times as "Sat, 05 Jun 2016 15:10:09 GMT"; ISO 8601 is taken too. AWS sends updates of one event
(a new status, a new window) with the same `eventArn`: what Stallwatch does about it is claimed once per event and job
(`aws.host_events`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, field_validator

from stallwatch.core import contract

# AWS Health's API reference: eventArn at most 1,600 characters; an event type code 3 to 100 characters, no ':' or
# '/'; an entity's value at most 1,224. Events are bounded by EventBridge's 256 KB; the entities read, here.
EVENT_ARN = r"^arn:aws[a-z-]*:health:[^:\s]*:[^:\s]*:event/\S+$"
EVENT_ARN_MAX = 1600
EVENT_TYPE_CODE = r"^[^:/\s]{3,100}$"
ENTITY_VALUE_MAX = 1224
ENTITIES_MAX = 5000
DESCRIPTION_MAX = 100_000
EC2_INSTANCE = re.compile(r"^(?:arn:aws[a-z-]*:ec2:[a-z0-9-]*:\d*:instance/)?(i-[0-9a-f]{8,17})$")
CLOSED = "closed"  # statusCode of an event that is over (or called off)
DESCRIPTION_LANGUAGE = "en_US"


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class EventDescription(_Model):
    language: str = Field("", max_length=32)
    latest_description: str = Field("", alias="latestDescription", max_length=DESCRIPTION_MAX)


class AffectedEntity(_Model):
    entity_value: str = Field(alias="entityValue", max_length=ENTITY_VALUE_MAX)


class HealthEventDetail(_Model):
    """The `detail` of an AWS Health event (the fields Stallwatch reads)."""

    event_arn: str = Field(alias="eventArn", pattern=EVENT_ARN, max_length=EVENT_ARN_MAX)
    service: str = Field(max_length=64)
    event_type_code: str = Field(alias="eventTypeCode", pattern=EVENT_TYPE_CODE)
    event_type_category: str = Field(alias="eventTypeCategory", max_length=255)
    status_code: str | None = Field(None, alias="statusCode", max_length=32)
    start_time: datetime = Field(alias="startTime")
    end_time: datetime | None = Field(None, alias="endTime")
    event_description: list[EventDescription] = Field(default_factory=list, alias="eventDescription", max_length=50)
    affected_entities: list[AffectedEntity] = Field(
        default_factory=list, alias="affectedEntities", max_length=ENTITIES_MAX
    )

    @field_validator("start_time", "end_time", mode="before")
    @classmethod
    def _aws_time(cls, value: Any) -> Any:
        """AWS Health's "Sat, 05 Jun 2016 15:10:09 GMT" (RFC 7231); anything else is left to pydantic (ISO 8601)."""
        if isinstance(value, str) and value[:3].isalpha() and "," in value:
            try:
                return parsedate_to_datetime(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"not a time AWS Health writes: {value[:40]!r}") from exc
        return value

    @property
    def scheduled(self) -> bool:
        """An EC2 scheduled change: what Stallwatch acts on (the rule sends no other; a test event might)."""
        return self.service == contract.HEALTH_EVENT_SERVICE and self.event_type_category == (
            contract.HEALTH_SCHEDULED_CATEGORY
        )

    @property
    def closed(self) -> bool:
        return (self.status_code or "").lower() == CLOSED

    def window(self) -> tuple[float, float | None]:
        return _epoch(self.start_time), _epoch(self.end_time) if self.end_time is not None else None

    def description(self) -> str:
        """AWS's own words for the event (English where given), on one line."""
        chosen = next((d for d in self.event_description if d.language == DESCRIPTION_LANGUAGE), None)
        chosen = chosen or next(iter(self.event_description), None)
        return " ".join(chosen.latest_description.split()) if chosen is not None else ""


class HealthEvent(EventBridgeModel):
    """EventBridge's "AWS Health Event"."""

    EVENT_NAME: ClassVar[str] = "AWS Health"
    source: Literal["aws.health"]
    detail_type: Literal["AWS Health Event"] = Field(alias="detail-type")
    resources: list[str] = Field(default_factory=list, max_length=ENTITIES_MAX)
    detail: HealthEventDetail

    def instances(self) -> list[str]:
        """The EC2 instances the event names: its affected entities, else its resources (ids or instance ARNs)."""
        values = [e.entity_value for e in self.detail.affected_entities] or self.resources
        found = {match[1] for value in values if (match := EC2_INSTANCE.match(value.strip()))}
        return sorted(found)


def _epoch(t: datetime) -> float:
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()
