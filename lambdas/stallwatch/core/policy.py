"""The one policy model: modes, thresholds and per-job tag overrides.

It renders the alarms (``alarms.py``), configures the Lambdas (the ``policy`` of the ``STALLWATCH_CONFIG``
environment variable's JSON, `config.StallwatchConfig`) and is validated at synth time by the stacks.

    policy = Policy(mode="notify")
    effective = policy.for_job({"stallwatch:mode": "enforce", "stallwatch:stall-minutes": "45"})
    effective.policy.thresholds.stall_minutes  # 45.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

TAG_PREFIX = "stallwatch:"
MODE_TAG = "stallwatch:mode"
# The tag the stop permissions are conditioned on when `stop_requires_tag` holds: value must be "enforce".
STOP_OPT_IN_TAG = MODE_TAG
STOP_OPT_IN_VALUE = "enforce"
EC2_MONITOR_TAG = "stallwatch:monitor"
# EC2 jobs tagged `stallwatch:recover=restart` are recovered in place instead of stopped (core.recovery); the SSM and
# Auto Scaling permissions are conditioned on this tag too.
RECOVER_TAG = "stallwatch:recover"
RECOVER_RESTART = "restart"
# A Slurm cluster's controller (or login node) where Stallwatch's Slurm documents may run: tagged so by its operator.
SLURM_CONTROLLER_TAG = "stallwatch:slurm"
SLURM_CONTROLLER_VALUE = "controller"
MAX_RESTARTS_LIMIT = 10  # resumes of one run, at most (`stallwatch:resume`, `resume_max_restarts`)


class Mode(StrEnum):
    """What Stallwatch may do about a job."""

    OFF = "off"  # nothing, not even an audit record
    OBSERVE = "observe"  # decide and audit only
    NOTIFY = "notify"  # decide, audit and alert on Slack
    ENFORCE = "enforce"  # alert, warn, then stop after `stop_grace_minutes`


class Thresholds(BaseModel):
    """When a signal counts as abnormal. Every field can be overridden per job by a tag
    ``stallwatch:<field-with-dashes>`` (``stallwatch:stall-minutes=45``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    stall_minutes: float = Field(15.0, gt=0, description="No completed step for this long is a stall.")
    step_interval_factor: float = Field(
        5.0, ge=1, description="Adaptive floor: a stall needs at least this many recent step intervals without a step."
    )
    log_silence_minutes: float = Field(
        15.0, gt=0, description="All hosts' logs silent this long (jobs without the agent)."
    )
    log_interval_factor: float = Field(
        10.0, ge=1, description="Adaptive floor: log silence needs at least this many recent logging intervals."
    )
    idle_gpu_percent: float = Field(5.0, ge=0, le=100, description="GPU utilization per device below this is idle.")
    busy_gpu_percent: float = Field(90.0, ge=0, le=100, description="GPU utilization per device above this is busy.")
    idle_minutes: float = Field(
        15.0, gt=0, description="All GPUs idle (or, without the agent, pinned busy) this long, logs silent: a stall."
    )
    crash_confirm_minutes: float = Field(
        3.0,
        gt=0,
        description="Conclusive evidence decides after this long with no progress since: a rank's fatal last words "
        "with its GPUs dead, a host that vanished, every process gone from its GPUs, a collective spinning on every "
        "host (no step, GPUs busy, power fallen).",
    )
    agreement_fraction: float = Field(
        2 / 3,
        gt=0,
        le=1,
        description="Independent signals that agree (no step + GPU power fallen on every host; idle GPUs + silent "
        "logs) decide after this fraction of the stall, idle and log thresholds; a lone signal waits them in full.",
    )
    power_drop_ratio: float = Field(
        0.6, gt=0, lt=1, description="Power below this fraction of its running baseline is a drop (hang at 100% util)."
    )
    startup_grace_minutes: float = Field(
        60.0, gt=0, description="Starting/Downloading may take this long before it is suspicious."
    )
    phase_overrun_minutes: float = Field(
        10.0, ge=0, description="A declared phase may overrun its budget by this much before it is a stall."
    )
    data_wait_percent: float = Field(50.0, gt=0, le=100, description="DataWaitFraction above this is starvation.")
    straggler_ratio: float = Field(
        1.2,
        gt=1,
        le=10,
        description="A host whose StepTime is this many times the other hosts' median (or whose GPU power is this "
        "many times below it) throughout straggler_minutes is a straggler (alerted, never stopped).",
    )
    straggler_minutes: float = Field(10.0, gt=0, le=180, description="How long a straggler must lag to be named.")
    stop_grace_minutes: float = Field(
        5.0, ge=0, description="Enforce: the stall must persist this long after the warning."
    )
    confirmed_grace_minutes: float = Field(
        2.0,
        ge=0,
        description="Enforce: after conclusive evidence (see crash_confirm_minutes) the stall need only persist this "
        "long after the warning; never more than stop_grace_minutes.",
    )
    stop_on_nonfinite_loss: bool = Field(False, description="Enforce: stop a job whose loss stays NaN/inf.")
    alarm_period_seconds: int = Field(
        60,
        gt=0,
        le=86_400,
        description="Alarm period; 10 or 30 use high-resolution metrics (the demo compresses time this way).",
    )

    @model_validator(mode="after")
    def _check(self) -> Thresholds:
        if self.alarm_period_seconds not in (10, 30) and self.alarm_period_seconds % 60:
            raise ValueError(
                f"alarm_period_seconds must be 10, 30 or a multiple of 60, got {self.alarm_period_seconds}"
            )
        if self.idle_gpu_percent >= self.busy_gpu_percent:
            raise ValueError(
                f"idle_gpu_percent ({self.idle_gpu_percent:g}) must be below "
                f"busy_gpu_percent ({self.busy_gpu_percent:g})"
            )
        return self


class Policy(BaseModel):
    """The global policy; `for_job` applies a job's tags on top of it."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = Field(Mode.NOTIFY, description="Default mode for jobs without a `stallwatch:mode` tag.")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    stop_requires_tag: bool = Field(
        True,
        description="Stop only resources tagged `stallwatch:mode=enforce` (also enforced by IAM). False allows all.",
    )
    monitor_sagemaker: bool = Field(True, description="Watch SageMaker training jobs.")
    monitor_ec2: bool = Field(True, description="Watch EC2 GPU instances tagged `stallwatch:monitor=true`.")
    monitor_slurm: bool = Field(
        True, description="Watch Slurm jobs, as deploy/slurm's PrologSlurmctld posts them (docs/deploy.md)."
    )
    resume_max_restarts: int = Field(
        0,
        ge=0,
        le=MAX_RESTARTS_LIMIT,
        description="Restarts from the last checkpoint after Stallwatch stops a hang or crashed rank, for jobs "
        "without a `stallwatch:resume` tag; 0 (the default) is off.",
    )
    run_summary: bool = Field(
        False, description="Post the goodput summary to Slack when a run ends (per job: `stallwatch:summary=true`)."
    )

    def stop_permitted(self, tags: dict[str, str]) -> bool:
        """Whether a resource with `tags` may be stopped at all: the code's twin of the IAM tag condition."""
        tagged = tags.get(STOP_OPT_IN_TAG, "").strip().lower() == STOP_OPT_IN_VALUE
        return tagged or not self.stop_requires_tag

    def for_job(self, tags: dict[str, str]) -> EffectivePolicy:
        """The policy for one job after its tags; bad tag values are reported and ignored."""
        errors: list[str] = []
        mode = self.mode
        raw_mode = tags.get(MODE_TAG)
        if raw_mode is not None:
            try:
                mode = Mode(raw_mode.strip().lower())
            except ValueError:
                errors.append(f"{MODE_TAG}={raw_mode!r}: expected one of {[m.value for m in Mode]}")
        thresholds = self.thresholds
        # Sorted, so the outcome does not depend on tag order; each override is validated with those before it,
        # and a rejected one leaves the thresholds as they were (setattr would keep a value its validator rejects).
        for key, value in sorted(tags.items()):
            if not key.startswith(TAG_PREFIX) or key == MODE_TAG:
                continue
            name = key.removeprefix(TAG_PREFIX).replace("-", "_")
            if name not in Thresholds.model_fields:
                continue
            try:
                thresholds = Thresholds.model_validate(thresholds.model_dump() | {name: value})
            except ValidationError as exc:
                errors.append(f"{key}={value!r}: {exc.errors()[0]['msg']}")
        policy = self.model_copy(update={"mode": mode, "thresholds": thresholds})
        may_stop = mode is Mode.ENFORCE and self.stop_permitted(tags)
        return EffectivePolicy(policy=policy, may_stop=may_stop, tag_errors=errors)


@dataclass(frozen=True)
class EffectivePolicy:
    """A job's policy after tags, and whether it may be stopped at all."""

    policy: Policy
    may_stop: bool
    tag_errors: list[str] = field(default_factory=list)

    @property
    def mode(self) -> Mode:
        return self.policy.mode

    @property
    def thresholds(self) -> Thresholds:
        return self.policy.thresholds
