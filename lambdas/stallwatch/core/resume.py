"""Resume planning: whether a stopped job may restart from its checkpoint, as what, and what Slack is told.

Pure: the caller reads the job (DescribeTrainingJob and its tags, or the EC2 group) and Stallwatch's stop from
the audit trail; `plan_resume` answers with a `ResumePlan` (the CreateTrainingJob request) or a `NoResume`.

    verdict = plan_resume(described, tags, stop, default_max_restarts=0, ended_at=now)
    if isinstance(verdict, ResumePlan):
        sagemaker.create_training_job(**verdict.request)

A run is a chain of jobs: the first keeps its name, attempt N is ``<first>-r<N>`` (a name that would pass 63
characters is cut and marked with a hash of the whole run name, so two runs never share a resume's name), and each
resumed job carries the chain in its tags (`RUN_TAG`, `RESUMED_FROM_TAG`, `ATTEMPT_TAG`, `BEST_STEP_TAG`), within
CreateTrainingJob's 50 tags (Stallwatch's own first; the user tags left off are named in Slack).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stallwatch.core.decision import Action, Diagnosis, stall_onset
from stallwatch.core.policy import MAX_RESTARTS_LIMIT

RESUME_TAG = "stallwatch:resume"  # opt-in: the most restarts of one run
CHECKPOINT_TAG = "stallwatch:checkpoint"  # the run's own checkpoint prefix (s3://...), when not in CheckpointConfig
RUN_TAG = "stallwatch:run"  # the first job of the chain: the run the goodput report is about
RESUMED_FROM_TAG = "stallwatch:resumed-from"
ATTEMPT_TAG = "stallwatch:resume-attempt"
BEST_STEP_TAG = "stallwatch:resume-best-step"  # the highest step the run had reached before this attempt
CHAIN_TAGS = frozenset({RUN_TAG, RESUMED_FROM_TAG, ATTEMPT_TAG, BEST_STEP_TAG})
RESUME_ACTION = "resume"  # the audit record of a resume
RECOVERY_OUTCOME = "recovery"  # in a stop decision's outcome: what its way back made of it (runtime.way_back)
LAUNCHED_FIELD = "launched"  # in an EC2 resume's audit record: when the group it restarted had started (LaunchTime)
AWS_TAG_PREFIX = "aws:"  # reserved: set by AWS, never by a CreateTrainingJob
MAX_JOB_NAME = 63  # CreateTrainingJob TrainingJobName
# CreateTrainingJob Tags: "Array Members: Minimum number of 0 items. Maximum number of 50 items."
# https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTrainingJob.html#sagemaker-CreateTrainingJob-request-Tags
MAX_TAGS = 50
STALLWATCH_TAG_PREFIX = "stallwatch:"
RUN_HASH_CHARS = 8  # hex digits of the run name's sha256 in a cut resume name
# Stallwatch's own stops that a restart can fix; idle means the work is done, and an overrun phase is the job's.
RESUMABLE = frozenset({Diagnosis.HANG, Diagnosis.CRASHED_RANK})
# DescribeTrainingJob fields that CreateTrainingJob takes as they are (all that both have, but the name, the algorithm
# and the stopping condition, which the clone sets; tests/core/test_resume.py checks this against botocore's model).
CLONED_FIELDS = (
    "HyperParameters",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "DebugHookConfig",
    "DebugRuleConfigurations",
    "TensorBoardOutputConfig",
    "ExperimentConfig",
    "ProfilerConfig",
    "ProfilerRuleConfigurations",
    "Environment",
    "RetryStrategy",
    "RemoteDebugConfig",
    "InfraCheckConfig",
    "MlflowConfig",
    "ModelPackageConfig",
    "ServerlessJobConfig",
)
ALGORITHM_FIELDS = (
    "TrainingImage",
    "AlgorithmName",
    "TrainingInputMode",
    "MetricDefinitions",
    "EnableSageMakerMetricsTimeSeries",
    "ContainerEntrypoint",
    "ContainerArguments",
    "TrainingImageConfig",
)
# The part of ProfilerRuleConfigurations/DebugRuleConfigurations Describe adds that Create rejects.
RULE_STATUS_FIELDS = ("RuleEvaluationStatus",)


class ResumeTagError(ValueError):
    """`stallwatch:resume` is not a whole number of restarts in range."""


@dataclass(frozen=True)
class StopRecord:
    """Stallwatch's stop of a job, from its audit record."""

    at: float
    diagnosis: str
    step: float | None  # the last step the agent reported (None without the agent)
    stall_onset: float  # when progress stopped (the last step, else the last log line, else the decision)
    ok: bool | None  # whether the stop call succeeded; None while its outcome is not recorded yet
    slack_ts: str | None = None  # the stop message's timestamp, for a thread (bot mode)
    why: str | None = None  # where the ranks were: the agent's stack dumps, summed up (`core.stack_dumps`)


@dataclass(frozen=True)
class ResumePlan:
    """Start `name` as attempt `attempt` of `max_restarts`; `request` is its CreateTrainingJob call (SageMaker) or
    its StartInstances call (EC2, which starts the same instances again)."""

    name: str
    attempt: int
    max_restarts: int
    request: dict[str, Any]
    best_step: float | None = None  # the highest step the run had reached: Slack hears when it is passed
    dropped_tags: tuple[str, ...] = ()  # the user tags left off the new job (CreateTrainingJob takes 50)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dropped_tags", tuple(self.dropped_tags))  # a list when read back from the store


@dataclass(frozen=True)
class NoResume:
    """Why the job is not resumed, and whether Slack hears of it (a run that opted in and could not)."""

    reason: str
    alert: bool


NOT_STOPPED_BY_STALLWATCH = NoResume("not stopped by Stallwatch (a human's stop, or the job's own end)", alert=False)


def max_restarts(tags: dict[str, str], default: int) -> int:
    """The restarts a run may use: its `stallwatch:resume` tag, else the policy's default (0: off)."""
    raw = tags.get(RESUME_TAG)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("off", "false", "no"):
        return 0
    if not text.isdigit() or not 0 <= int(text) <= MAX_RESTARTS_LIMIT:
        raise ResumeTagError(f"{RESUME_TAG}={raw!r}: expected a whole number of restarts, 0 to {MAX_RESTARTS_LIMIT}")
    return int(text)


def attempt_of(tags: dict[str, str]) -> int:
    """Which restart this job is: 0 for the run's first job."""
    raw = tags.get(ATTEMPT_TAG, "0").strip()
    return int(raw) if raw.isdigit() else 0


def run_name(job: str, tags: dict[str, str]) -> str:
    """The run a job belongs to: the chain's first job."""
    return tags.get(RUN_TAG) or job


def resume_name(run: str, attempt: int) -> str:
    """``<run>-r<attempt>``; where that passes SageMaker's 63 characters, ``<run cut>-<hash>-r<attempt>``, the hash
    of the whole run name, so runs that share their first characters (SDK names ending in a timestamp) get names of
    their own."""
    suffix = f"-r{attempt}"
    if len(run) + len(suffix) <= MAX_JOB_NAME:
        return f"{run}{suffix}"
    digest = hashlib.sha256(run.encode()).hexdigest()[:RUN_HASH_CHARS]
    marked = f"-{digest}{suffix}"
    return f"{run[: MAX_JOB_NAME - len(marked)].rstrip('-')}{marked}"


def best_step(tags: dict[str, str]) -> float | None:
    """The highest step the run had reached before this job started (None if unknown)."""
    raw = tags.get(BEST_STEP_TAG)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def has_checkpoint(described: dict[str, Any], tags: dict[str, str]) -> bool:
    """A CheckpointConfig with an S3 URI, or a tag naming the run's checkpoint prefix."""
    uri = (described.get("CheckpointConfig") or {}).get("S3Uri", "")
    return bool(uri) or tags.get(CHECKPOINT_TAG, "").startswith("s3://")


def stop_of(record: dict[str, Any], outcome: dict[str, Any] | None) -> StopRecord | None:
    """A decision's audit record as Stallwatch's stop, or None if the decision was not a stop of the engine's
    (an operator's "Stop now" is recorded with its own action, and counts as a human's stop), or a stop decision that
    recovered the job in place instead (`core.way_back`: its outcome has a recovery and no stop)."""
    if record.get("action") != Action.STOP.value:
        return None
    if outcome and RECOVERY_OUTCOME in outcome and "stop" not in outcome:
        return None
    evidence = record.get("evidence") or {}
    agent = evidence.get("agent") or {}
    at = float(record["at"])
    stop = (outcome or {}).get("stop") or {}
    slack = (outcome or {}).get("slack") or {}
    return StopRecord(
        at=at,
        diagnosis=str(record.get("diagnosis", "")),
        step=agent.get("step"),
        stall_onset=stall_onset(evidence) or at,
        ok=stop.get("ok"),
        slack_ts=slack.get("ts"),
        why=(evidence.get("stacks") or {}).get("summary"),
    )


def plan_resume(
    described: dict[str, Any],
    tags: dict[str, str],
    stop: StopRecord | None,
    default_max_restarts: int,
) -> ResumePlan | NoResume:
    """What to do about a SageMaker job that is Stopped: the CreateTrainingJob of its next attempt, or why not.

    `described` is DescribeTrainingJob's answer, `tags` the job's tags, `stop` Stallwatch's last stop of it."""
    name = described["TrainingJobName"]
    verdict = next_attempt(tags, stop, default_max_restarts, attempt_of(tags), best_step(tags))
    if isinstance(verdict, NoResume):
        return verdict
    if not has_checkpoint(described, tags):
        return NoResume("cannot resume: no checkpoint (no CheckpointConfig, no stallwatch:checkpoint tag)", alert=True)
    runtime = _remaining_runtime(described)
    if runtime <= 0:
        return NoResume("gave up: MaxRuntimeInSeconds is used up", alert=True)
    assert stop is not None  # next_attempt refuses without Stallwatch's stop
    run = run_name(name, tags)
    attempt, allowed = verdict
    chain = {RUN_TAG: run, RESUMED_FROM_TAG: name, ATTEMPT_TAG: str(attempt)}
    best = max((s for s in (best_step(tags), stop.step) if s is not None), default=None)
    if best is not None:
        chain[BEST_STEP_TAG] = f"{best:g}"
    new_name = resume_name(run, attempt)
    kept, dropped = capped_tags(chain, _kept_tags(tags))
    request = clone_request(described, new_name, runtime, kept)
    return ResumePlan(
        name=new_name, attempt=attempt, max_restarts=allowed, request=request, best_step=best, dropped_tags=dropped
    )


def capped_tags(chain: dict[str, str], tags: dict[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The resumed job's tags within `MAX_TAGS`: the chain's, then the job's `stallwatch:*` tags, then its user tags
    in their order; and the keys left off."""
    ranked = [
        *chain.items(),
        *((k, v) for k, v in tags.items() if k.startswith(STALLWATCH_TAG_PREFIX) and k not in chain),
        *((k, v) for k, v in tags.items() if not k.startswith(STALLWATCH_TAG_PREFIX)),
    ]
    return dict(ranked[:MAX_TAGS]), tuple(k for k, _ in ranked[MAX_TAGS:])


def next_attempt(
    tags: dict[str, str], stop: StopRecord | None, default_max_restarts: int, done: int, before: float | None
) -> tuple[int, int] | NoResume:
    """(the attempt to start, the restarts allowed), or why there is none: a run that opted in, was stopped by
    Stallwatch for a stall a restart fixes, has restarts left, and gained a step since its last restart.

    `done` is the restarts used so far, `before` the highest step reached before the last restart."""
    refusal = _refusal(stop)
    if refusal is not None:
        return refusal
    assert stop is not None
    try:
        allowed = max_restarts(tags, default_max_restarts)
    except ResumeTagError as exc:
        return NoResume(f"cannot resume: {exc}", alert=True)
    if allowed == 0:
        return NoResume("resume is off for this job", alert=False)
    if done >= allowed:
        return NoResume(f"gave up: restart budget spent ({done} of {allowed} restarts)", alert=True)
    if done and before is not None and stop.step is not None and stop.step <= before:
        return NoResume(f"gave up: no progress after {done} restart{'s' if done > 1 else ''}", alert=True)
    return done + 1, allowed


def _refusal(stop: StopRecord | None) -> NoResume | None:
    """Only Stallwatch's own, successful stop of a hang or a crashed rank is resumed."""
    if stop is None:
        return NOT_STOPPED_BY_STALLWATCH
    if stop.ok is False:
        return NoResume("Stallwatch's stop failed: the job was stopped by someone else", alert=False)
    if stop.diagnosis not in {d.value for d in RESUMABLE}:
        return NoResume(f"stopped for {stop.diagnosis}: not a stall a restart fixes", alert=False)
    return None


def _kept_tags(tags: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tags.items() if not k.startswith(AWS_TAG_PREFIX) and k not in CHAIN_TAGS}


def _remaining_runtime(described: dict[str, Any]) -> int:
    """MaxRuntimeInSeconds less the training time the job used."""
    limit = int(described.get("StoppingCondition", {}).get("MaxRuntimeInSeconds", 0))
    used = described.get("TrainingTimeInSeconds")
    if used is None:
        start = described.get("TrainingStartTime") or described.get("CreationTime")
        end = described.get("TrainingEndTime") or described.get("LastModifiedTime")
        used = _seconds_between(start, end)
    return limit - int(used)


def _seconds_between(start: Any, end: Any) -> float:
    if isinstance(start, datetime) and isinstance(end, datetime):
        return max((end - start).total_seconds(), 0.0)
    return 0.0


def clone_request(described: dict[str, Any], name: str, max_runtime_s: int, tags: dict[str, str]) -> dict[str, Any]:
    """The CreateTrainingJob request of a copy of `described` named `name`, with `max_runtime_s` and `tags`."""
    algorithm = {k: v for k, v in described["AlgorithmSpecification"].items() if k in ALGORITHM_FIELDS}
    if "AlgorithmName" in algorithm:  # a Marketplace/own algorithm resource defines its image and metrics
        algorithm.pop("TrainingImage", None)
        algorithm.pop("MetricDefinitions", None)
    request: dict[str, Any] = {"TrainingJobName": name, "AlgorithmSpecification": algorithm}
    for key in CLONED_FIELDS:
        value = described.get(key)
        if value not in (None, [], {}):
            request[key] = _without_status(value)
    request["StoppingCondition"] = {**described.get("StoppingCondition", {}), "MaxRuntimeInSeconds": max_runtime_s}
    request["Tags"] = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    return request


def _without_status(value: Any) -> Any:
    if isinstance(value, list):
        return [
            {k: v for k, v in item.items() if k not in RULE_STATUS_FIELDS} if isinstance(item, dict) else item
            for item in value
        ]
    return value


# ---- what Slack is told ---------------------------------------------------------------------------------------


def resumed_text(job: str, plan: ResumePlan) -> str:
    text = f":arrows_counterclockwise: `{job}` resumed as `{plan.name}` (attempt {plan.attempt} of {plan.max_restarts})"
    if plan.dropped_tags:
        left_off = ", ".join(f"`{key}`" for key in plan.dropped_tags)
        text += f"; tags left off (SageMaker takes {MAX_TAGS} a job, Stallwatch's kept first): {left_off}"
    return text


def not_resumed_text(job: str, refusal: NoResume) -> str:
    return f":no_entry: `{job}`: {refusal.reason}"


def progress_text(job: str, step: float, seconds_after_restart: float) -> str:
    # a datapoint is stamped with its period's start, which can fall just before the restart
    after = _duration(max(seconds_after_restart, 0.0))
    return f":white_check_mark: `{job}`: step {step:,.0f} reached {after} after the restart"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def resume_failed_text(job: str, name: str, detail: str) -> str:
    return f":x: `{job}`: resume as `{name}` FAILED: {detail}"
