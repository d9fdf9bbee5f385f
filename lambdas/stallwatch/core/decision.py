"""What the decision engine returns, and the control plane's memory of a job between decisions."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from stallwatch.core.policy import Mode


class Diagnosis(StrEnum):
    """What the engine thinks is happening."""

    HEALTHY = "healthy"
    STARTING = "starting"  # Starting / Downloading / no step yet, within grace
    PHASE = "phase"  # a declared checkpoint/eval within its budget
    SLOW = "slow"  # slow but progressing
    DATA_STARVATION = "data_starvation"  # alert, never stop
    NONFINITE_LOSS = "nonfinite_loss"  # alert; stop only if the policy says so
    PHASE_OVERRUN = "phase_overrun"  # a declared phase past its budget
    STRAGGLER = "straggler"  # one host far slower than the others: alert, never stop
    HANG = "hang"  # no progress while GPUs stay busy (NCCL hang)
    CRASHED_RANK = "crashed_rank"  # a fatal error on one host while others spin
    IDLE = "idle"  # all GPUs idle and logs silent
    FINISHED = "finished"  # the job is no longer running


# Diagnoses that are stalls: the job burns GPUs without progress.
STALLS = frozenset({Diagnosis.PHASE_OVERRUN, Diagnosis.HANG, Diagnosis.CRASHED_RANK, Diagnosis.IDLE})
# Diagnoses that are no problem: nothing to alert, no incident open.
NOT_PROBLEMS = frozenset({Diagnosis.HEALTHY, Diagnosis.STARTING, Diagnosis.PHASE, Diagnosis.FINISHED})


class Action(StrEnum):
    """What the control plane does about it."""

    NONE = "none"
    AUDIT = "audit"  # observe mode: record what would have been done
    ALERT = "alert"  # Slack, no stop planned
    WARN = "warn"  # Slack: this job will be stopped after the grace period
    STOP = "stop"


@dataclass(frozen=True)
class Cadence:
    """What the engine learned of the job's rhythm in one decision; `next_state` keeps it in `JobState`."""

    step_interval_s: float | None = None  # the recent seconds per step
    log_gap_s: float | None = None  # the longest log silence the job came back from
    busy_pause_s: float | None = None  # the longest pause (no step, else no line) it came back from, GPUs busy
    idle_pause_s: float | None = None  # ... with GPUs idle and their memory held (a checkpoint, an input stall)


@dataclass(frozen=True)
class Decision:
    """The engine's answer: what is happening, what to do, why, and the evidence."""

    job: str
    at: float
    diagnosis: Diagnosis
    action: Action
    mode: Mode
    reasons: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)
    # In observe/notify mode: what enforce would have done (backtests read this).
    would: Action = Action.NONE
    # Whether enforce stops for this diagnosis (stalls; non-finite loss when the policy says so).
    stoppable: bool = False
    cadence: Cadence = Cadence()
    # A lone signal reaches its full threshold then: decide again at that time (the sweeper does) even without an alarm.
    recheck_at: float | None = None

    @property
    def stalled(self) -> bool:
        return self.diagnosis in STALLS


@dataclass(frozen=True)
class JobState:
    """The control plane's memory of a job between decisions (DynamoDB in AWS, memory in replay)."""

    stall_since: float | None = None  # first decision that saw the current stall
    warned_at: float | None = None  # when the stop warning went out
    alerted: tuple[str, ...] = ()  # diagnoses already alerted for the current incident
    snoozed_until: float | None = None
    threshold_factor: float = 1.0  # "Not stalled" doubles it for the rest of the run
    stopped_at: float | None = None
    # Learned across decisions (`Cadence`): they outlive the metrics' 3-hour lookback.
    step_interval_s: float | None = None
    log_gap_s: float | None = None
    step_gap_s: float | None = None  # the longest stall without a step the job recovered from after a warning
    busy_pause_s: float | None = None  # the longest healthy pauses it came back from (`Cadence`): they only grow
    idle_pause_s: float | None = None
    stall_from: float | None = None  # the last progress (step, else log line) before the current incident
    recheck_at: float | None = None  # the engine asked to decide again at this time
    stragglers: tuple[str, ...] = ()  # hosts already named as stragglers in this run (each is alerted once)
    deaths: tuple[float, ...] = ()  # the fatal bursts lately seen as a host's last words, oldest first (a crash loop)
    # The incident's stop warning: (diagnosis, the last progress before it, when it went out). Kept while no progress
    # is seen, so a warning withdrawn by a decision that lost sight of its evidence keeps its grace when re-issued.
    warning: tuple[str, float, float] | None = None

    def with_(self, **changes: Any) -> JobState:
        return replace(self, **changes)

    def snoozed(self, until: float) -> JobState:
        """No stop before `until`; the warning is void, so when the snooze ends a fresh one comes before any stop."""
        return replace(self, snoozed_until=until, warned_at=None, warning=None)


def stall_onset(evidence: dict[str, Any], noticed: float | None = None) -> float | None:
    """When a stall began, from a decision's evidence: the last step, else the last log line, else `noticed`."""
    agent = evidence.get("agent") or {}
    return agent.get("last_step_t") or (evidence.get("logs") or {}).get("last_t") or noticed
