"""What happened during the run, shared by the moving parts and read by the terminal view and the summary.

Writers (training reader, host simulator, control plane, Slack receiver) call `event` and the
`set_*` methods from their threads; readers take a consistent `snapshot`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum


class Kind(StrEnum):
    """What an event is about (the view colours by it)."""

    SETUP = "setup"
    TRAIN = "train"
    FAULT = "fault"
    STACKS = "stacks"  # a rank's stack dump (the agent's, at a stall)
    ALARM = "alarm"
    DECISION = "decision"
    SLACK = "slack"
    JOB = "job"
    ERROR = "error"


@dataclass(frozen=True)
class Event:
    t: float
    kind: Kind
    text: str


@dataclass(frozen=True)
class Progress:
    """The training's latest agent window (the EMF line on its stdout)."""

    t: float | None = None
    step: int | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    loss: float | None = None
    last_step_age: float | None = None
    phase_budget_remaining: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of the run's state."""

    started_at: float
    progress: Progress
    gpu_util_per_device: float | None
    alarms: dict[str, str]
    job_status: str
    secondary_status: str
    fault_onset: float | None
    stop_requested_at: float | None
    events: tuple[Event, ...]


@dataclass
class _State:
    progress: Progress = Progress()
    gpu_util_per_device: float | None = None
    alarms: dict[str, str] = field(default_factory=dict)
    job_status: str = "-"
    secondary_status: str = "-"
    fault_onset: float | None = None
    stop_requested_at: float | None = None
    events: list[Event] = field(default_factory=list)


class Timeline:
    """Thread-safe record of the run; `listeners` are called with each new event."""

    def __init__(self) -> None:
        self.started_at = time.time()
        self._state = _State()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Event], None]] = []

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def event(self, kind: Kind, text: str) -> Event:
        event = Event(t=time.time(), kind=kind, text=text)
        with self._lock:
            self._state.events.append(event)
        for listener in self._listeners:
            listener(event)
        return event

    def set_progress(self, progress: Progress) -> None:
        with self._lock:
            self._state.progress = progress

    def set_gpu_util(self, per_device: float | None) -> None:
        with self._lock:
            self._state.gpu_util_per_device = per_device

    def set_alarm(self, name: str, state: str) -> str | None:
        """Record an alarm's state; returns the previous one."""
        with self._lock:
            previous = self._state.alarms.get(name)
            self._state.alarms[name] = state
            return previous

    def clear_alarms(self) -> None:
        """Forget the alarms shown (the job ended and its alarms were deleted)."""
        with self._lock:
            self._state.alarms.clear()

    def set_job_status(self, status: str, secondary_status: str) -> bool:
        """Record the job's status; True when it changed."""
        with self._lock:
            changed = (status, secondary_status) != (self._state.job_status, self._state.secondary_status)
            self._state.job_status, self._state.secondary_status = status, secondary_status
            return changed

    def mark_fault_onset(self, t: float) -> bool:
        """Record when the fault began (first call wins); True when this call recorded it."""
        with self._lock:
            if self._state.fault_onset is not None:
                return False
            self._state.fault_onset = t
            return True

    def mark_stop_requested(self, t: float) -> None:
        with self._lock:
            if self._state.stop_requested_at is None:
                self._state.stop_requested_at = t

    def snapshot(self) -> Snapshot:
        with self._lock:
            s = self._state
            return Snapshot(
                started_at=self.started_at,
                progress=replace(s.progress),
                gpu_util_per_device=s.gpu_util_per_device,
                alarms=dict(s.alarms),
                job_status=s.job_status,
                secondary_status=s.secondary_status,
                fault_onset=s.fault_onset,
                stop_requested_at=s.stop_requested_at,
                events=tuple(s.events),
            )
