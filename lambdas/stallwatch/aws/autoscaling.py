"""Taking a bad node out of its Auto Scaling group: marked unhealthy, the group terminates and replaces it.

group_of(instance)                        # "train-asg" from the instance's aws:autoscaling:groupName tag, or None
error = mark_unhealthy(clients, "i-0abc...")   # "" when the group took it
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.api_errors import api_error

GROUP_TAG = "aws:autoscaling:groupName"  # EC2 Auto Scaling tags every instance it launches with its group


def group_of(instance: dict[str, Any]) -> str | None:
    """The Auto Scaling group a DescribeInstances instance belongs to, or None."""
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == GROUP_TAG), None)


def mark_unhealthy(clients: Any, instance_id: str) -> str:
    """SetInstanceHealth Unhealthy, now (not after the group's grace period); the error, or "" when accepted."""
    try:
        clients.autoscaling.set_instance_health(
            InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
        )
    except (ClientError, BotoCoreError) as exc:
        return f"SetInstanceHealth {instance_id}: {api_error(exc)}"
    return ""
