"""A small moto extension: an Auto Scaling group replaces an instance marked unhealthy, as EC2 Auto Scaling does.

moto 5.2.5's SetInstanceHealth only records the health status. After `install()`, an instance marked Unhealthy
is terminated and the group launches its replacement (its launch template and the tags it propagates at launch,
`aws:autoscaling:groupName` among them), as the group does at its next health check. An instance no group holds
is refused (ValidationError), as Auto Scaling refuses it.

    from localrun import moto_autoscaling
    moto_autoscaling.install()
"""

from __future__ import annotations

from typing import Any

from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.models import AutoScalingBackend

UNHEALTHY = "Unhealthy"

_original: Any = None


def _set_instance_health(self: AutoScalingBackend, instance_id: str, health_status: str) -> None:
    group = next(
        (g for g in self.autoscaling_groups.values() for s in g.instance_states if s.instance.id == instance_id),
        None,
    )
    if group is None:
        raise ValidationError(f"Instance Id not found - No managed instance found for instance ID: {instance_id}")
    _original(self, instance_id, health_status)
    if health_status != UNHEALTHY:
        return
    group.instance_states = [s for s in group.instance_states if s.instance.id != instance_id]
    self.ec2_backend.terminate_instances([instance_id])
    group.set_desired_capacity(group.desired_capacity)  # launches the missing instance


def install() -> None:
    """Patch moto (idempotent)."""
    global _original
    if _original is None:
        _original = AutoScalingBackend.set_instance_health
        AutoScalingBackend.set_instance_health = _set_instance_health  # type: ignore[method-assign]
