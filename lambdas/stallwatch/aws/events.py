"""The events the Lambdas receive, as pydantic models for the Powertools parser.

- `JobStateEvent`: EventBridge "SageMaker Training Job State Change", "EC2 Instance State-change Notification", or
  deploy/slurm's "Slurm Job State Change" (source `stallwatch.slurm`).
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

from datetime import datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import CloudFormationCustomResourceBaseModel, EventBridgeModel
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.subscription_payloads import BoundedLogsModel
from stallwatch.core import contract
from stallwatch.core.platforms import describe
from stallwatch.core.platforms.slurm import time_limit_seconds
from stallwatch.core.signals import Platform

SAGEMAKER_STATE_CHANGE = "SageMaker Training Job State Change"
EC2_STATE_CHANGE = "EC2 Instance State-change Notification"
SLURM_STATE_CHANGE = contract.SLURM_EVENT_DETAIL_TYPE
SLURM_SOURCE = contract.SLURM_EVENT_SOURCE  # deploy/slurm/stallwatch-events.sh's PutEvents
ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"

# AWS's own limits, enforced at parse time so an oversized field never reaches a read or a DynamoDB key.
ALARM_NAME_MAX = 255  # PutMetricAlarm AlarmName
ALARM_REASON_MAX = 1023  # StateReason
ARN_MAX = 1600
INSTANCE_TYPE_MAX = 64
MAX_INSTANCE_GROUPS = 20  # far above what a heterogeneous cluster may have; bounds the event's size
TAGS_MAX = 50  # tags per resource
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256
LOGGED_EVENT_CHARS = 2000  # a malformed event is logged this far, never whole
# CloudWatch writes "2026-11-30T10:00:00.000+0000"; EventBridge "2026-11-30T10:00:00Z".
ISO_8601 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})$"
AWS_REGION = r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$"
SAGEMAKER_JOB_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
EC2_INSTANCE_ID = r"^i-[0-9a-f]{8,17}$"
# deploy/slurm's event: what the script writes (its strings at most 512 bytes, at most 2,000 nodes).
SLURM_TEXT_MAX = 512
SLURM_NODES_MAX = 2000
SLURM_TIME = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$"  # as Slurm prints it, the controller's local time
SLURM_NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# Where the documents run: the EC2 instance (tagged stallwatch:slurm=controller) of the controller or a login node;
# none: the job is watched and alerted on, never acted on.
SSM_TARGET = r"^(i-[0-9a-f]{8,17})?$"
SETTINGS_MAX = 50  # as a resource's tags
RECHECK_SOURCE = "stallwatch.recheck"  # a recheck's input says so; AWS's sources all start with "aws."
RECHECK_AT_MAX = 32_503_680_000.0  # 3000-01-01 UTC: any later `at` is not a time the engine gave
DATA_MESSAGE = "DATA_MESSAGE"  # a subscription's log events; CONTROL_MESSAGE: CloudWatch Logs checking the destination


class InvalidEventError(ValueError):
    """An event that does not match the shape the handler expects; nothing was changed."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class InstanceGroup(_Model):
    """One group of a heterogeneous cluster."""

    instance_group_name: str = Field(alias="InstanceGroupName", min_length=1, max_length=64)
    instance_type: str = Field(alias="InstanceType", min_length=1, max_length=INSTANCE_TYPE_MAX)
    instance_count: int = Field(alias="InstanceCount", ge=0, le=10_000)


class ResourceConfig(_Model):
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


class TrainingJobDetail(_Model):
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


class InstanceStateDetail(_Model):
    instance_id: str = Field(alias="instance-id", pattern=EC2_INSTANCE_ID)
    state: Literal["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


class InstanceStateChange(EventBridgeModel):
    source: Literal["aws.ec2"]
    detail_type: Literal["EC2 Instance State-change Notification"] = Field(alias="detail-type")
    detail: InstanceStateDetail


class SlurmNodeDetail(_Model):
    """One node of a Slurm job, as the prolog names it: its Slurm name, its NodeAddr, its GPUs (Gres)."""

    name: str = Field(pattern=SLURM_NODE_NAME)
    addr: str = Field("", max_length=SLURM_TEXT_MAX)
    gpus: int = Field(0, ge=0, le=1024)


class SlurmJobDetail(_Model):
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
    submit_epoch: int = Field(gt=0, lt=RECHECK_AT_MAX)
    start_epoch: int = Field(0, ge=0, lt=RECHECK_AT_MAX)
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


JobStateEvent = Annotated[
    TrainingJobStateChange | InstanceStateChange | SlurmJobStateChange, Field(discriminator="detail_type")
]


class AlarmState(_Model):
    value: Literal["OK", "ALARM", "INSUFFICIENT_DATA"]
    reason: str = Field("", max_length=ALARM_REASON_MAX)
    timestamp: str = Field(pattern=ISO_8601, max_length=40)


class AlarmData(_Model):
    alarm_name: str = Field(alias="alarmName", min_length=1, max_length=ALARM_NAME_MAX)
    state: AlarmState
    previous_state: AlarmState | None = Field(None, alias="previousState")

    @property
    def dedup_key(self) -> str:
        """One alarm transition, however often it is delivered."""
        return f"{self.alarm_name}@{self.state.timestamp}"


class AlarmActionEvent(_Model):
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


class TestAlertRequest(_Model):
    """Who asked for a test alert (their IAM identity, from sts:GetCallerIdentity)."""

    requested_by: str = Field(min_length=1, max_length=ARN_MAX, pattern=r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:")


class TestAlertEvent(_Model):
    """The event `stallwatch doctor --send-test-alert` invokes on_alarm with."""

    request: TestAlertRequest = Field(alias=TEST_ALERT_KEY)


class ScheduledEvent(EventBridgeModel):
    """The sweeper's schedule (EventBridge rule or Scheduler); its content is not used."""

    detail: dict[str, Any] | str = Field(default_factory=dict)


class RecheckEvent(_Model):
    """A one-time schedule's input (`aws.rechecks`): decide on the job again at `at` (epoch seconds), when the
    engine said its evidence turns decisive (`Decision.recheck_at`)."""

    source: Literal["stallwatch.recheck"]
    platform: Platform
    job: str = Field(min_length=1, max_length=63)
    at: float = Field(gt=0, lt=RECHECK_AT_MAX, allow_inf_nan=False)

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


class SubscriptionProperties(_Model):
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
        return parse(event=event, model=_ADAPTERS[model])
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
    return "alarm or recheck" if model is OnAlarmEvent else names.get(model, str(model))
