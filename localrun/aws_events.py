"""The events AWS would deliver to the Lambdas, in their real shapes.

- `training_job_state_change`: EventBridge "SageMaker Training Job State Change" (detail as DescribeTrainingJob).
- `instance_state_change`: EventBridge "EC2 Instance State-change Notification" (one per instance).
- `alarm_action`: the payload CloudWatch sends when an alarm's action is a Lambda function.
- `scheduled`: the EventBridge "Scheduled Event" that runs the sweeper.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from localrun.local_aws import ACCOUNT_ID, REGION

SWEEPER_RULE = "stallwatch-sweeper-schedule"


@dataclass(frozen=True)
class TrainingJobRecord:
    """What the local platform created for the job (the fields a state-change event carries)."""

    name: str
    arn: str
    instance_type: str
    instance_count: int
    tags: dict[str, str]
    created_at: float
    role_arn: str
    image: str
    max_runtime_s: int


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cloudwatch_time(t: float) -> str:
    """CloudWatch's alarm timestamp format: 2024-01-01T12:00:00.123+0000."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"


def _envelope(source: str, detail_type: str, t: float, resources: list[str], detail: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": ACCOUNT_ID,
        "time": _iso(t),
        "region": REGION,
        "resources": resources,
        "detail": detail,
    }


def training_job_state_change(
    job: TrainingJobRecord, status: str, secondary_status: str, t: float, failure_reason: str | None = None
) -> dict[str, Any]:
    """EventBridge "SageMaker Training Job State Change"; times in epoch milliseconds as SageMaker sends them."""
    detail: dict[str, Any] = {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary_status,
        "AlgorithmSpecification": {"TrainingImage": job.image, "TrainingInputMode": "File"},
        "RoleArn": job.role_arn,
        "ResourceConfig": {
            "InstanceType": job.instance_type,
            "InstanceCount": job.instance_count,
            "VolumeSizeInGB": 100,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": job.max_runtime_s},
        "CreationTime": int(job.created_at * 1000),
        "TrainingStartTime": int(job.created_at * 1000),
        "LastModifiedTime": int(t * 1000),
        "Tags": dict(job.tags),
    }
    if status in ("Completed", "Failed", "Stopped"):
        detail["TrainingEndTime"] = int(t * 1000)
    if failure_reason:
        detail["FailureReason"] = failure_reason
    return _envelope("aws.sagemaker", "SageMaker Training Job State Change", t, [job.arn], detail)


def instance_state_change(instance_id: str, state: str, t: float) -> dict[str, Any]:
    """EventBridge "EC2 Instance State-change Notification": the instance id and its new state, nothing else."""
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT_ID}:instance/{instance_id}"
    detail = {"instance-id": instance_id, "state": state}
    return _envelope("aws.ec2", "EC2 Instance State-change Notification", t, [arn], detail)


def _lambda_metric(query: dict[str, Any]) -> dict[str, Any]:
    """One alarm metric in the Lambda action payload's (camel-case) form."""
    out: dict[str, Any] = {"id": query["Id"], "returnData": query.get("ReturnData", True)}
    if "MetricStat" in query:
        stat = query["MetricStat"]
        metric = stat["Metric"]
        out["metricStat"] = {
            "metric": {
                "namespace": metric["Namespace"],
                "name": metric["MetricName"],
                "dimensions": {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])},
            },
            "period": stat["Period"],
            "stat": stat["Stat"],
        }
    else:
        out["expression"] = query["Expression"]
        out["label"] = query.get("Label", query["Id"])
    return out


@dataclass(frozen=True)
class AlarmStateRecord:
    """An alarm state as CloudWatch reports it."""

    value: str
    reason: str
    t: float

    def payload(self) -> dict[str, Any]:
        return {"value": self.value, "reason": self.reason, "timestamp": _cloudwatch_time(self.t)}


def alarm_action(alarm: dict[str, Any], state: AlarmStateRecord, previous: AlarmStateRecord) -> dict[str, Any]:
    """The event CloudWatch sends to a Lambda alarm action; `alarm` is the alarm as DescribeAlarms returns it."""
    if alarm.get("Metrics"):
        metrics = [_lambda_metric(query) for query in alarm["Metrics"]]
    else:
        simple = {
            "Id": "m1",
            "MetricStat": {
                "Metric": {k: alarm[k] for k in ("Namespace", "MetricName", "Dimensions")},
                "Period": alarm["Period"],
                "Stat": alarm["Statistic"],
            },
        }
        metrics = [_lambda_metric(simple)]
    return {
        "source": "aws.cloudwatch",
        "alarmArn": alarm["AlarmArn"],
        "accountId": ACCOUNT_ID,
        "time": _cloudwatch_time(state.t),
        "region": REGION,
        "alarmData": {
            "alarmName": alarm["AlarmName"],
            "state": state.payload(),
            "previousState": previous.payload(),
            "configuration": {"description": alarm.get("AlarmDescription", ""), "metrics": metrics},
        },
    }


def scheduled(t: float) -> dict[str, Any]:
    """EventBridge's "Scheduled Event" for the sweeper's rule."""
    rule_arn = f"arn:aws:events:{REGION}:{ACCOUNT_ID}:rule/{SWEEPER_RULE}"
    return _envelope("aws.events", "Scheduled Event", t, [rule_arn], {})
