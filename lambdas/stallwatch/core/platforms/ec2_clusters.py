"""Which instances make one EC2 job: those grouped by their `stallwatch:job` tag, and their tags merged.

    job_of(tags, "i-0abc...")                                # "llm-70b" (tag), the id, or None (not watched)
    merged = merge_instance_tags([tags_1, tags_2], policy)   # merged.tags, merged.errors (disagreeing tags)
    layout = ec2_layout({"i-0abc...": "p5.48xlarge"})        # the job's primary type and hosts

On EC2 a job is the set of instances that share ``stallwatch:job=<name>``; an instance tagged
``stallwatch:monitor=true`` without a job tag is a one-instance job named by its id. Tags that disagree across a
job's instances are reported, and the safer value applies: the least acting mode, the slower threshold.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from stallwatch.core.platforms.interface import InstanceLayout
from stallwatch.core.policy import EC2_MONITOR_TAG, MODE_TAG, TAG_PREFIX, Mode, Policy, Thresholds
from stallwatch.core.signals import JobStatus

JOB_TAG = "stallwatch:job"
LOG_GROUP_TAG = "stallwatch:log-group"
MONITOR_TAG_VALUE = "true"
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}\Z")
# A job tag value becomes alarm names and the JobName dimension: no '.', at most 63 characters, as SageMaker's.
JOB_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]){0,62}\Z")
LIVE_EC2_STATES = frozenset({"pending", "running"})
STOPPING_EC2_STATES = frozenset({"stopping", "shutting-down"})
# The modes from least to most acting: disagreeing mode tags take the first.
MODE_ORDER = (Mode.OFF, Mode.OBSERVE, Mode.NOTIFY, Mode.ENFORCE)
# Thresholds whose lower value acts sooner or more often, so the safer of two is the lower one; for every other
# threshold (minutes, factors, busy percent, period) the higher value is the safer.
SAFER_LOWER = frozenset({"idle_gpu_percent", "power_drop_ratio", "stop_on_nonfinite_loss"})


def monitored(tags: Mapping[str, str]) -> bool:
    """`stallwatch:monitor=true`, in any case (`True`, `TRUE`)."""
    return tags.get(EC2_MONITOR_TAG, "").strip().lower() == MONITOR_TAG_VALUE


def job_tag_error(tags: Mapping[str, str]) -> str | None:
    """Why the instance's `stallwatch:job` tag cannot name a job; None when it is absent or valid."""
    value = tags.get(JOB_TAG)
    if value is None or JOB_NAME.match(value):
        return None
    return f"{JOB_TAG}={value!r}: expected letters, digits, '-' or '_' (at most 63, no '.')"


def job_of(tags: Mapping[str, str], instance_id: str) -> str | None:
    """The job an instance belongs to: its valid `stallwatch:job` tag, else its id when it is tagged
    `stallwatch:monitor=true`, else None (Stallwatch does not watch it)."""
    value = tags.get(JOB_TAG)
    if value is not None and job_tag_error(tags) is None:
        return value
    return instance_id if monitored(tags) else None


@dataclass(frozen=True)
class MergedTags:
    """A job's tags from its instances': the ones they agree on, the safer value where they disagree."""

    tags: dict[str, str]
    errors: list[str] = field(default_factory=list)


def merge_instance_tags(tag_sets: Sequence[Mapping[str, str]], policy: Policy) -> MergedTags:
    """One tag set for a job whose instances carry `tag_sets`.

    Tags all instances agree on are kept. A `stallwatch:` tag that differs (or is missing on some instances) is a
    tag error, and the safer value applies; a missing tag counts as the global policy's value, and when that is the
    safer one the tag is left out (so a stop opt-in that some instances lack never applies). Other tags that differ
    (``Name=node-1``, ``Name=node-2``) are dropped without an error."""
    merged: dict[str, str] = {}
    errors: list[str] = []
    keys = sorted({key for tags in tag_sets for key in tags})
    for key in keys:
        values = [tags.get(key) for tags in tag_sets]
        if len(set(values)) == 1:
            merged[key] = values[0]  # type: ignore[assignment]  # all present and equal
            continue
        if not key.startswith(TAG_PREFIX):
            continue
        chosen = _safer(key, values, policy)
        seen = sorted({v if v is not None else "(absent)" for v in values})
        errors.append(f"{key} differs across the job's instances {seen}: {chosen or '(absent)'} applies")
        if chosen is not None:
            merged[key] = chosen
    return MergedTags(tags=merged, errors=errors)


def _safer(key: str, values: list[str | None], policy: Policy) -> str | None:
    """The safer of the values (None: the tag is absent, meaning the policy's own value)."""
    present = sorted({v for v in values if v is not None})
    absent = None in values
    if key == MODE_TAG:
        ranked = {v: _mode_rank(v) for v in present}
        default_rank = MODE_ORDER.index(policy.mode)
        best = min(ranked.values(), default=len(MODE_ORDER))
        return None if absent and default_rank <= best else min(present, key=lambda v: ranked[v])
    name = key.removeprefix(TAG_PREFIX).replace("-", "_")
    if name not in Thresholds.model_fields:
        return present[0] if present else None  # no order to go by: the first, and the error says so
    numbers = {v: n for v in present if (n := _number(v)) is not None}
    if not numbers:
        return None  # every value is malformed: the policy's own applies
    sign = -1 if name in SAFER_LOWER else 1
    best = max(numbers, key=lambda v: sign * numbers[v])
    default = _number(str(getattr(policy.thresholds, name)))
    if absent and default is not None and sign * default >= sign * numbers[best]:
        return None
    return best


def _mode_rank(value: str) -> int:
    try:
        return MODE_ORDER.index(Mode(value.strip().lower()))
    except ValueError:
        return len(MODE_ORDER)  # malformed: never the safer one


def _number(value: str) -> float | None:
    text = value.strip().lower()
    if text in ("true", "false"):
        return float(text == "true")
    try:
        return float(text)
    except ValueError:
        return None


def ec2_status(states: Iterable[str]) -> JobStatus:
    """A job's status from its instances' states: running while one runs, stopping while one stops, else stopped."""
    seen = set(states)
    if seen & LIVE_EC2_STATES:
        return JobStatus.RUNNING
    return JobStatus.STOPPING if seen & STOPPING_EC2_STATES else JobStatus.STOPPED


def ec2_hosts(instances: Mapping[str, str]) -> list[str]:
    """The job's hosts (instance id -> state): the running ones, or all of them once none runs (an ended job)."""
    live = sorted(i for i, state in instances.items() if state in LIVE_EC2_STATES)
    return live or sorted(instances)


def log_group_of(tags: Mapping[str, str], configured: str) -> tuple[str, str | None]:
    """The job's EC2 log group: its `stallwatch:log-group` tag when it is the configured group or under it (the
    functions may read only those), else the configured group, with the reason."""
    value = tags.get(LOG_GROUP_TAG)
    if value is None or value == configured or value.startswith(f"{configured.rstrip('/')}/"):
        return value or configured, None
    return configured, f"{LOG_GROUP_TAG}={value!r}: must be {configured!r} or under it; {configured!r} applies"


def ec2_layout(instance_types: Mapping[str, str]) -> InstanceLayout:
    """An EC2 job's hosts (instance id -> type): the most common type is the primary one."""
    counts = Counter(instance_types.values())
    primary = max(sorted(counts), key=lambda t: counts[t])
    host_types = dict(instance_types) if len(counts) > 1 else {}
    return InstanceLayout(primary, len(instance_types), host_types)
