"""A small moto extension: EC2 instances whose LaunchTime moves on every start, as EC2's does.

moto 5.2.5 keeps an instance's first LaunchTime across StopInstances/StartInstances; EC2 reports the latest start,
which is what `aws.platforms.ec2_goodput` reads an attempt's start from. After `install()`, StartInstances moves it;
`set_instance_times` puts a start or a stop (``StateTransitionReason``) at a given time, for a test's clock.

    from localrun import moto_ec2
    moto_ec2.install()
    moto_ec2.set_instance_times(["i-0abc..."], launched=t0, stopped=t0 + 3600)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from moto.core.utils import utcnow
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import Instance, InstanceState

from localrun.moto_sagemaker import DEFAULT_ACCOUNT, DEFAULT_REGION

_original_start = Instance.start


def _start(self: Instance) -> InstanceState:
    previous = _original_start(self)
    if previous.name != "running":
        self.launch_time = utcnow()
    return previous


def install() -> None:
    """Patch moto (idempotent): StartInstances moves the instance's LaunchTime."""
    Instance.start = _start  # type: ignore[method-assign]


def set_instance_times(
    instance_ids: Iterable[str],
    launched: float | None = None,
    stopped: float | None = None,
    account_id: str = DEFAULT_ACCOUNT,
    region: str = DEFAULT_REGION,
) -> None:
    """The instances' latest start (`launched`, epoch) and, for stopped ones, when they were stopped (`stopped`),
    as EC2 writes it in StateTransitionReason: ``User initiated (2026-11-30 10:00:00 GMT)``."""
    backend = ec2_backends[account_id][region]
    for instance_id in instance_ids:
        instance = backend.get_instance(instance_id)
        if launched is not None:
            instance.launch_time = _naive(launched)
        if stopped is not None:
            instance._reason = f"User initiated ({_naive(stopped):%Y-%m-%d %H:%M:%S} GMT)"


def _naive(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC).replace(tzinfo=None)
