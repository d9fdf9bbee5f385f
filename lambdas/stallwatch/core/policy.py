"""The one policy model: modes, thresholds and per-job tag overrides.

It renders the alarms (``alarms.py``), configures the Lambdas (the ``policy`` of the ``STALLWATCH_CONFIG``
environment variable's JSON, `config.StallwatchConfig`) and is validated at synth time by the stacks.

    policy = Policy(mode="notify")
    effective = policy.for_job({"stallwatch:mode": "enforce", "stallwatch:stall-minutes": "45"})
    effective.policy.thresholds.stall_minutes  # 45.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stallwatch.core import log_patterns
from stallwatch.core.contract import STACKS_MARKER

TAG_PREFIX = "stallwatch:"
MODE_TAG = "stallwatch:mode"
# The tag the stop permissions are conditioned on when `stop_requires_tag` holds: value must be "enforce".
STOP_OPT_IN_TAG = MODE_TAG
STOP_OPT_IN_VALUE = "enforce"
EC2_MONITOR_TAG = "stallwatch:monitor"
# A job's way back in place of its stop (`core.way_back`, one grammar): an EC2 job restarted in place on its nodes (the
# SSM and Auto Scaling permissions are conditioned on this tag too), a Slurm job requeued; or stopped (the default).
RECOVER_TAG = "stallwatch:recover"
RECOVER_RESTART = "restart"
RECOVER_REQUEUE = "requeue"  # a Slurm job: the nodes a health signal blames drained, the job requeued (its runner)
RECOVER_STOP = "stop"
# The role of a Slurm cluster's controllers (and login nodes), tagged so by its operator: only a role with this tag may
# put events on the stack's Slurm event bus.
SLURM_CONTROLLER_TAG = "stallwatch:slurm"
SLURM_CONTROLLER_VALUE = "controller"
MAX_RESTARTS_LIMIT = 10  # resumes of one run, at most (`stallwatch:resume`, `resume_max_restarts`)
# A job's own log lines, one regex per tag (`LogLines`); a SageMaker tag value holds only [\p{L}\p{Z}\p{N}_.:/=+\-@].
LINE_TAGS = {
    "stallwatch:fatal-line": "fatal",
    "stallwatch:checkpoint-start-line": "checkpoint_start",
    "stallwatch:checkpoint-end-line": "checkpoint_end",
}
LINE_PATTERN_MAX = 200  # characters of one of your own line regexes
LINE_PATTERNS_MAX = 10  # of them in each list
LINE_REPEATS_MAX = 3  # unbounded repetitions (*, +, {n,}) in one regex: each is a scan of the line
_UNBOUNDED = re.compile(r"(?<!\\)(?:[*+]|\{\d*,\})")


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
    busy_silence_minutes: float = Field(
        30.0,
        gt=0,
        description="Without the agent and without GPU power: every GPU busy and the logs silent this long is a hang "
        "(or 1.5x the longest such silence the job came back from, if longer). Raise it for a job whose first "
        "evaluation runs longer without a log line.",
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


def check_line_pattern(pattern: str) -> str:
    """`pattern` if it is a regex the engine may run on every line and CloudWatch Logs can filter by; else ValueError
    saying why: it must compile, hold at most `LINE_PATTERN_MAX` characters and `LINE_REPEATS_MAX` unbounded
    repetitions, and no group (parentheses), lookaround or backreference (none of them goes into a CloudWatch filter
    pattern, and without groups no quantifier can nest: no catastrophic backtracking)."""
    if not pattern.strip():
        raise ValueError("an empty pattern would match every line")
    if len(pattern) > LINE_PATTERN_MAX:
        raise ValueError(f"{len(pattern)} characters; at most {LINE_PATTERN_MAX}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
    try:
        log_patterns.filter_regex(pattern)
    except ValueError as exc:
        raise ValueError(f"{pattern!r}: {exc}; write each alternative as its own entry") from None
    if len(_UNBOUNDED.findall(pattern)) > LINE_REPEATS_MAX:
        raise ValueError(f"{pattern!r} repeats without bound more than {LINE_REPEATS_MAX} times (*, +, {{n,}})")
    if re.search(pattern, ""):
        raise ValueError(f"{pattern!r} matches an empty line, so every line")
    return pattern


class LogLines(BaseModel):
    """Your own log lines, beside the built-in ones (`log_patterns`): regexes (Python syntax, no groups), matched
    anywhere in a line, case-sensitively. They name a line fatal (`user_fatal`), or a checkpoint's start (or a line
    written while it is being written) or end, and CloudWatch Logs is asked for them too. Per job, a tag adds one of
    each (`stallwatch:fatal-line`, `stallwatch:checkpoint-start-line`, `stallwatch:checkpoint-end-line`)."""

    model_config = ConfigDict(extra="forbid")

    fatal: list[str] = Field(default_factory=list, max_length=LINE_PATTERNS_MAX, description="Lines that mean death.")
    checkpoint_start: list[str] = Field(
        default_factory=list,
        max_length=LINE_PATTERNS_MAX,
        description="A checkpoint's start, or a line written while it is.",
    )
    checkpoint_end: list[str] = Field(
        default_factory=list, max_length=LINE_PATTERNS_MAX, description="A checkpoint's end (training goes on after)."
    )

    @field_validator("fatal", "checkpoint_start", "checkpoint_end")
    @classmethod
    def _check(cls, patterns: list[str]) -> list[str]:
        for i, pattern in enumerate(patterns):
            try:
                check_line_pattern(pattern)
            except ValueError as exc:
                raise ValueError(f"entry {i}: {exc}") from None
        return patterns

    @model_validator(mode="after")
    def _fits_the_filters(self) -> LogLines:
        filters = (self.subscription_filter, self.line_patterns().filter_patterns[1])
        for name, pattern in zip(("fatal", "checkpoint_start/checkpoint_end"), filters, strict=True):
            if len(pattern) > log_patterns.FILTER_PATTERN_MAX:
                raise ValueError(
                    f"{name}: the server-side filter pattern would hold {len(pattern)} characters with these lines; "
                    f"CloudWatch Logs takes at most {log_patterns.FILTER_PATTERN_MAX}: shorten or drop some"
                )
        return self

    @property
    def subscription_filter(self) -> str:
        """The training logs' subscription filter: the fatal lines' (built-in and these) and the agent's stall record
        (its stack dumps' marker), so that either wakes the engine."""
        return log_patterns.fatal_filter_pattern((*self.fatal, STACKS_MARKER))

    def line_patterns(self) -> log_patterns.LinePatterns:
        """The built-in lines plus these."""
        if not (self.fatal or self.checkpoint_start or self.checkpoint_end):
            return log_patterns.BUILT_IN
        return log_patterns.LinePatterns.extended(self.fatal, self.checkpoint_start, self.checkpoint_end)


class Policy(BaseModel):
    """The global policy; `for_job` applies a job's tags on top of it."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = Field(Mode.NOTIFY, description="Default mode for jobs without a `stallwatch:mode` tag.")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    stop_requires_tag: bool = Field(
        True,
        description="Stop only resources tagged `stallwatch:mode=enforce` (also enforced by IAM). False allows all.",
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
    log_lines: LogLines = Field(default_factory=LogLines, description="Your own fatal and checkpoint log lines.")

    @property
    def fatal_filter_pattern(self) -> str:
        """The subscription filter's pattern: the fatal lines, built-in and the deployment's own (tags are per job:
        they are read, but wake nothing), and the agent's stall record (`LogLines.subscription_filter`)."""
        return self.log_lines.subscription_filter

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
        log_lines = self.log_lines
        for key, name in LINE_TAGS.items():  # each on its own: a bad one leaves the others
            value = tags.get(key, "").strip()
            if value:
                try:
                    log_lines = LogLines.model_validate(
                        log_lines.model_dump() | {name: [*getattr(log_lines, name), value]}
                    )
                except ValidationError as exc:
                    errors.append(f"{key}={value!r}: {exc.errors()[0]['msg']}")
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
        policy = self.model_copy(update={"mode": mode, "thresholds": thresholds, "log_lines": log_lines})
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

    @cached_property
    def line_patterns(self) -> log_patterns.LinePatterns:
        """What names the job's log lines: the built-in ones, the deployment's and its tags' own."""
        return self.policy.log_lines.line_patterns()
