"""The events the Lambdas receive, as pydantic models for the Powertools parser.

- `JobStateEvent`: a platform's state-change event, each platform's model beside its adapter
  (`aws/platforms/<name>_events.py`, its adapter's `state_event`), told apart by its detail-type.
- `AlarmEvent`: a CloudWatch alarm's direct Lambda action, or the EventBridge "CloudWatch Alarm State Change".
- `ScheduledEvent`: the sweeper's EventBridge schedule.
- `RecheckEvent`: a one-time EventBridge Scheduler schedule's input (`aws.rechecks`): decide on a job again.
- `OnAlarmEvent`: what on_alarm receives, an `AlarmEvent` or a `RecheckEvent` (told apart by `source`).
- `TestAlertEvent`: `stallwatch doctor --send-test-alert`'s invocation of on_alarm.
- `SubscriptionRequest`: CloudFormation's request to the custom resource of the SageMaker group's subscription.
- `LogLinesEvent`: a CloudWatch Logs subscription's delivery (Powertools' `CloudWatchLogsModel`: ``awslogs.data``
  is base64 of gzipped JSON, decoded as `.awslogs.decoded_data`, here inflated at most 1 MB), a DATA_MESSAGE of log
  events or a CONTROL_MESSAGE.

    event = parse_event(raw, AlarmEvent)   # raises InvalidEventError naming the bad fields
    event.alarm.alarm_name, event.alarm.dedup_key
"""

from __future__ import annotations

import functools
import operator
from datetime import datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import CloudFormationCustomResourceBaseModel, EventBridgeModel
from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from stallwatch.aws.event_fields import EPOCH_MAX, EventFields
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms import ADAPTERS
from stallwatch.aws.subscription_payloads import BoundedLogsModel
from stallwatch.core import contract
from stallwatch.core.platforms import describe
from stallwatch.core.signals import Platform

ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"

# AWS's own limits, enforced at parse time so an oversized field never reaches a read or a DynamoDB key.
ALARM_NAME_MAX = 255  # PutMetricAlarm AlarmName
ALARM_REASON_MAX = 1023  # StateReason
ARN_MAX = 1600
LOGGED_EVENT_CHARS = 2000  # a malformed event is logged this far, never whole
# CloudWatch writes "2026-11-30T10:00:00.000+0000"; EventBridge "2026-11-30T10:00:00Z".
ISO_8601 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})$"
AWS_REGION = r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$"
RECHECK_SOURCE = "stallwatch.recheck"  # a recheck's input says so; AWS's sources all start with "aws."
DATA_MESSAGE = "DATA_MESSAGE"  # a subscription's log events; CONTROL_MESSAGE: CloudWatch Logs checking the destination


class InvalidEventError(ValueError):
    """An event that does not match the shape the handler expects; nothing was changed."""


# Each platform's state-change event (its adapter's `state_event`, `aws/platforms/<name>_events.py`), told apart by
# its detail-type.
JobStateEvent = Annotated[
    functools.reduce(operator.or_, (adapter.state_event for adapter in ADAPTERS.values())),
    Field(discriminator="detail_type"),
]


class AlarmState(EventFields):
    value: Literal["OK", "ALARM", "INSUFFICIENT_DATA"]
    reason: str = Field("", max_length=ALARM_REASON_MAX)
    timestamp: str = Field(pattern=ISO_8601, max_length=40)


class AlarmData(EventFields):
    alarm_name: str = Field(alias="alarmName", min_length=1, max_length=ALARM_NAME_MAX)
    state: AlarmState
    previous_state: AlarmState | None = Field(None, alias="previousState")

    @property
    def dedup_key(self) -> str:
        """One alarm transition, however often it is delivered."""
        return f"{self.alarm_name}@{self.state.timestamp}"


class AlarmActionEvent(EventFields):
    """The payload CloudWatch sends when the alarm's action is the Lambda function itself."""

    source: Literal["aws.cloudwatch"]
    alarm_arn: str = Field(alias="alarmArn", pattern=r"^arn:aws[a-z-]*:cloudwatch:", max_length=ARN_MAX)
    time: datetime
    region: str = Field(pattern=AWS_REGION)
    alarm_data: AlarmData = Field(alias="alarmData")

    @property
    def alarm(self) -> AlarmData:
        return self.alarm_data


class AlarmStateChange(EventBridgeModel):
    """The EventBridge "CloudWatch Alarm State Change" event."""

    source: Literal["aws.cloudwatch"]
    detail_type: Literal["CloudWatch Alarm State Change"] = Field(alias="detail-type")
    detail: AlarmData

    @property
    def alarm(self) -> AlarmData:
        return self.detail


AlarmEvent = AlarmActionEvent | AlarmStateChange


TEST_ALERT_KEY = "stallwatch_test_alert"  # on_alarm's event from `stallwatch doctor --send-test-alert`


class TestAlertRequest(EventFields):
    """Who asked for a test alert (their IAM identity, from sts:GetCallerIdentity)."""

    requested_by: str = Field(min_length=1, max_length=ARN_MAX, pattern=r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:")


class TestAlertEvent(EventFields):
    """The event `stallwatch doctor --send-test-alert` invokes on_alarm with."""

    request: TestAlertRequest = Field(alias=TEST_ALERT_KEY)


class ScheduledEvent(EventBridgeModel):
    """The sweeper's schedule (EventBridge rule or Scheduler); its content is not used."""

    detail: dict[str, Any] | str = Field(default_factory=dict)


class RecheckEvent(EventFields):
    """A one-time schedule's input (`aws.rechecks`): decide on the job again at `at` (epoch seconds), when the
    engine said its evidence turns decisive (`Decision.recheck_at`)."""

    source: Literal["stallwatch.recheck"]
    platform: Platform
    job: str = Field(min_length=1, max_length=63)
    at: float = Field(gt=0, lt=EPOCH_MAX, allow_inf_nan=False)

    @field_validator("job")
    @classmethod
    def _job_name(cls, value: str, info: ValidationInfo) -> str:
        # The names a job of its platform can have: SageMaker's, or an EC2 job tag's (an instance id included)
        platform = info.data.get("platform")
        if platform is None:  # the platform's own error says what is wrong
            return value
        if not describe(platform).names_job(value):
            raise ValueError(f"not a {platform.value} job name: {value!r}")
        return value

    @property
    def dedup_key(self) -> str:
        """One recheck, however often it is delivered."""
        return f"recheck:{self.platform.value}:{self.job}@{self.at:.3f}"


def _on_alarm_kind(event: Any) -> str:
    return "recheck" if isinstance(event, dict) and event.get("source") == RECHECK_SOURCE else "alarm"


OnAlarmEvent = Annotated[
    Annotated[AlarmEvent, Tag("alarm")] | Annotated[RecheckEvent, Tag("recheck")], Discriminator(_on_alarm_kind)
]

LogLinesEvent = BoundedLogsModel  # Powertools' model, inflated at most INFLATED_BYTES (aws.subscription_payloads)
# PutSubscriptionFilter's limits (CloudWatch Logs API reference): filterName 1-512 characters, no ':' or '*';
# filterPattern at most 1,024 characters; logGroupName 1-512 of [.-_/#A-Za-z0-9].
FILTER_NAME = r"^[^:*]{1,512}$"
FILTER_PATTERN_MAX = 1024
LOG_GROUP_NAME = r"^[.\-_/#A-Za-z0-9]{1,512}$"
LAMBDA_ARN = r"^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:function:[A-Za-z0-9_-]{1,64}$"


class SubscriptionProperties(EventFields):
    """The custom resource's properties: this deployment's filter on a log group it does not own."""

    log_group_name: str = Field(alias="LogGroupName", pattern=LOG_GROUP_NAME)
    filter_name: str = Field(alias="FilterName", pattern=FILTER_NAME)
    filter_pattern: str = Field(alias="FilterPattern", max_length=FILTER_PATTERN_MAX)
    destination_arn: str = Field(alias="DestinationArn", pattern=LAMBDA_ARN)


class SubscriptionRequest(CloudFormationCustomResourceBaseModel):
    """CloudFormation's Create, Update or Delete of `Custom::FatalLineSubscription`."""

    request_type: Literal["Create", "Update", "Delete"] = Field(alias="RequestType")
    physical_resource_id: str | None = Field(None, alias="PhysicalResourceId")
    resource_properties: SubscriptionProperties = Field(alias="ResourceProperties")  # type: ignore[assignment]
    old_resource_properties: dict[str, Any] | None = Field(None, alias="OldResourceProperties")  # an Update's

    @property
    def previous_destination(self) -> str | None:
        """The destination an Update moves the filter from, if it kept its group and name."""
        old, new = self.old_resource_properties or {}, self.resource_properties
        same = (old.get("LogGroupName"), old.get("FilterName")) == (new.log_group_name, new.filter_name)
        destination = old.get("DestinationArn")
        return destination if same and isinstance(destination, str) and destination != new.destination_arn else None


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {
    model: TypeAdapter(model)
    for model in (
        JobStateEvent,
        AlarmEvent,
        ScheduledEvent,
        RecheckEvent,
        OnAlarmEvent,
        TestAlertEvent,
        LogLinesEvent,
        SubscriptionRequest,
    )
}


def parse_event(event: Any, model: Any) -> Any:
    """Parse `event` as `model` with the Powertools parser; `InvalidEventError` names every bad field."""
    try:
        # a model of another module (aws.health_events) gets its adapter on first use
        return parse(event=event, model=_ADAPTERS.get(model) or _ADAPTERS.setdefault(model, TypeAdapter(model)))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<event>'}: {err['msg']}" for err in exc.errors()
        )
        error = InvalidEventError(f"malformed {_name(model)} event: {problems}")
        logged = {"error": str(error)[:LOGGED_EVENT_CHARS], "event": str(event)[:LOGGED_EVENT_CHARS]}
        logger.error("malformed event; nothing was changed", extra=logged)
        metrics.add_metric(name=contract.MALFORMED_EVENTS, unit=MetricUnit.Count, value=1)
        raise error from exc


def _name(model: Any) -> str:
    names = {
        JobStateEvent: "job state",
        AlarmEvent: "alarm",
        ScheduledEvent: "scheduled",
        RecheckEvent: "recheck",
        TestAlertEvent: "test alert",
        LogLinesEvent: "CloudWatch Logs subscription",
        SubscriptionRequest: "custom resource",
    }
    return "alarm or recheck" if model is OnAlarmEvent else names.get(model, getattr(model, "EVENT_NAME", str(model)))
