"""A small moto extension: EC2 instances whose LaunchTime moves on every start, as EC2's does; tags and images read
by id.

moto 5.2.5 keeps an instance's first LaunchTime across StopInstances/StartInstances; EC2 reports the latest start,
which is what `aws.platforms.ec2_goodput` reads an attempt's start from. After `install()`, StartInstances moves it;
`set_instance_times` puts a start or a stop (``StateTransitionReason``) at a given time, for a test's clock.

moto reads each resource's tags by filtering every tag of every resource with a pattern, and each new instance's
image by filtering every one of its 1,300 images, so a RunInstances or DescribeInstances of a 1,000-node cluster took
seconds; after `install()` both are looked up by id (the same answers, in the same order).

    from localrun import moto_ec2
    moto_ec2.install()
    moto_ec2.set_instance_times(["i-0abc..."], launched=t0, stopped=t0 + 3600)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from moto.core.utils import utcnow
from moto.ec2.models import ec2_backends
from moto.ec2.models.amis import Ami, AmiBackend
from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.models.instances import Instance, InstanceState
from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

from localrun.moto_sagemaker import DEFAULT_ACCOUNT, DEFAULT_REGION

_original_start = Instance.start
_original_describe_images = AmiBackend.describe_images
_PATTERN_CHARS = frozenset("*?[")  # what makes an image-id filter a pattern (fnmatch's)


def _start(self: Instance) -> InstanceState:
    previous = _original_start(self)
    if previous.name != "running":
        self.launch_time = utcnow()
    return previous


def _tags(self: TaggedEC2Resource) -> list[dict[str, str]]:
    """The resource's tags as moto's `describe_tags` of its id gives them, read from its own entry."""
    resource_id: str = self.id  # type: ignore[attr-defined]
    if not resource_id:
        return []
    kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
    own = self.ec2_backend.tags.get(resource_id, {})  # type: ignore[attr-defined]
    return [{"resource_id": resource_id, "key": k, "value": v, "resource_type": kind} for k, v in own.items()]


def _describe_images(
    self: AmiBackend,
    ami_ids: list[str] | None = None,
    filters: dict[str, Any] | None = None,
    exec_users: list[str] | None = None,
    owners: list[str] | None = None,
) -> list[Ami]:
    """moto's, but an image-id filter of one exact id (a new instance's look-up of its image) reads that image."""
    image_id = (filters or {}).get("image-id")
    exact = isinstance(image_id, str) and not _PATTERN_CHARS & set(image_id)
    if ami_ids or exec_users or owners or list(filters or {}) != ["image-id"] or not exact:
        return _original_describe_images(self, ami_ids, filters, exec_users, owners)
    image = self.amis.get(image_id)
    return [image] if image is not None else []


def install() -> None:
    """Patch moto (idempotent): StartInstances moves the instance's LaunchTime; a resource's tags and an instance's
    image are read by id."""
    Instance.start = _start  # type: ignore[method-assign]
    TaggedEC2Resource.get_tags = _tags  # type: ignore[method-assign]
    AmiBackend.describe_images = _describe_images  # type: ignore[method-assign]


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
