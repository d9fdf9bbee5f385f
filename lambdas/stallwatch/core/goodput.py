"""Goodput of a run: how much of the wall time and the GPU time paid for did useful work, and where the rest went.

A run is a chain of jobs (the first one and its resumes). Its wall time, from the first job's creation to the last
one's end, is split into categories that add up to it:

- productive: windows with steps, except the steps a restart trained again (goodput);
- redone: steps trained again after a restart, from the checkpoint back up to the step the run had reached;
- startup: from a job's creation to its first step or phase (instances, image, data download), or to its Training
  status for a job without the agent;
- phases: declared phases (checkpoint, eval) within their budget;
- stalls: from a stall's onset (the last step) to Stallwatch's stop;
- restart gaps: from Stallwatch's stop to the next attempt's creation (the stopping job's shutdown included);
- what a scheduler held the job in, each its own (a Slurm job's): pending in the queue before it ran, suspended,
  preempted or requeued by someone else until it ran again, and past its time limit until the scheduler ended it;
- other: the rest (windows without a step outside a stall, the last job's shutdown and upload).

GPU-hours and dollars are counted while a job holds its instances (nothing between jobs), per instance type for a
heterogeneous job. On EC2 a run is one job name: each start of its instance group is an attempt, given as a `JobSpan`
(`aws.platforms.ec2_goodput`).

    goodput = measure_goodput("llama-8b", [JobSpan(...), JobSpan(...)])
    goodput.ratio, goodput.totals[Category.STALLS].gpu_hours
    run_timeline([JobSpan(...), ...])   # the same split as segments in time: (attempt, start, end, category), ...
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stallwatch.core.pricing import estimate_fleet_burn, instance_spec

SUMMARY_TAG = "stallwatch:summary"  # "true": post the run's goodput to Slack when it ends (policy: run_summary)


class Category(StrEnum):
    PRODUCTIVE = "productive"
    REDONE = "redone"
    STARTUP = "startup"
    PHASES = "phases"
    STALLS = "stalls"
    RESTART_GAPS = "restart_gaps"
    PENDING = "pending"
    SUSPENDED = "suspended"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    TIME_LIMIT = "time_limit"
    OTHER = "other"


# A scheduler's holds (Slurm's): in a run's totals only where it has some (other platforms' runs have none).
SCHEDULER_CATEGORIES = frozenset(
    {Category.PENDING, Category.SUSPENDED, Category.PREEMPTED, Category.REQUEUED, Category.TIME_LIMIT}
)


@dataclass(frozen=True)
class Window:
    """One agent window (or metric period) of a job: `steps` completed in [start, end), `step` reached at its end."""

    start: float
    end: float
    steps: float
    step: float | None = None
    in_phase: bool = False  # a declared phase within its budget (PhaseBudgetRemaining > 0)
    tflops_per_gpu: float | None = None
    mfu: float | None = None


@dataclass(frozen=True)
class JobSpan:
    """One job of the run: while it held its instances, its windows, and Stallwatch's stop if there was one."""

    name: str
    instance_type: str
    hosts: int
    created: float
    ended: float  # its end, or now while it runs
    windows: tuple[Window, ...] = ()
    stall: tuple[float, float] | None = None  # (onset, Stallwatch's stop)
    stall_why: str | None = None  # where the ranks were when it was stopped (the stop's stacks summary)
    training_started: float | None = None  # SageMaker's "Training" status: ends the startup of a job without windows
    fleet: dict[str, int] = field(default_factory=dict)  # instance type -> hosts where they differ; else hosts x type
    # A scheduler's job (Slurm): when it entered the queue; from then to `created` (its nodes) it waited, as `gap`.
    submitted: float | None = None
    # How the time before it counts: from the previous job's end (or `submitted`, for the first) to its creation.
    gap: Category = Category.RESTART_GAPS
    # Stretches within it the scheduler held it in a state that is not a stall (suspended, past its time limit).
    held: tuple[tuple[float, float, Category], ...] = ()

    @property
    def begins(self) -> float:
        """Where its part of the run's wall time begins: its submission, else its creation."""
        return min(self.submitted, self.created) if self.submitted is not None else self.created

    def instance_types(self) -> dict[str, int]:
        """Instance type -> hosts of it, for the job's burn."""
        return self.fleet or {self.instance_type: self.hosts}


@dataclass(frozen=True)
class Total:
    seconds: float = 0.0
    gpu_hours: float = 0.0
    dollars: float | None = None

    def plus(self, seconds: float, gpu_hours: float, dollars: float | None) -> Total:
        both = None if self.dollars is None and dollars is None else (self.dollars or 0.0) + (dollars or 0.0)
        return Total(self.seconds + seconds, self.gpu_hours + gpu_hours, both)


@dataclass(frozen=True)
class Goodput:
    """A run's split of wall time, GPU-hours and dollars by `Category`, and its efficiency while stepping."""

    run: str
    jobs: tuple[str, ...]
    wall_s: float
    totals: dict[Category, Total] = field(default_factory=dict)
    mean_tflops_per_gpu: float | None = None  # time-weighted over windows with steps
    mean_mfu: float | None = None  # percent
    stalls_caught: int = 0
    final_step: float | None = None
    redone_steps: float = 0.0
    stall_whys: tuple[tuple[str, str], ...] = ()  # (job, where its ranks were) for each stall caught that says

    @property
    def ratio(self) -> float:
        """Goodput: productive step time over wall time."""
        return self.totals[Category.PRODUCTIVE].seconds / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def restarts(self) -> int:
        return len(self.jobs) - 1

    @property
    def gpu_hours(self) -> float:
        return sum(t.gpu_hours for t in self.totals.values())

    @property
    def dollars(self) -> float | None:
        known = [t.dollars for t in self.totals.values() if t.dollars is not None]
        return sum(known) if known else None

    def as_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "jobs": list(self.jobs),
            "wall_s": self.wall_s,
            "goodput": self.ratio,
            "gpu_hours": self.gpu_hours,
            "dollars": self.dollars,
            "categories": {c.value: vars(t) for c, t in self.totals.items()},
            "mean_tflops_per_gpu": self.mean_tflops_per_gpu,
            "mean_mfu": self.mean_mfu,
            "stalls_caught": self.stalls_caught,
            "restarts": self.restarts,
            "final_step": self.final_step,
            "redone_steps": self.redone_steps,
            "stalls": [{"job": job, "why": why} for job, why in self.stall_whys],
        }


def summary_wanted(tags: dict[str, str], default: bool) -> bool:
    """Whether the run's end posts its goodput to Slack: the `stallwatch:summary` tag, else the policy."""
    raw = tags.get(SUMMARY_TAG)
    return default if raw is None else raw.strip().lower() in ("true", "yes", "on", "1")


@dataclass(frozen=True)
class _Span:
    start: float
    end: float
    category: Category


@dataclass(frozen=True)
class Segment:
    """A stretch of the run's wall time in one category: within attempt `attempt` (its index among the run's jobs by
    creation), or, `held` False, the gap after it, while no job holds instances."""

    attempt: int
    start: float
    end: float
    category: Category
    held: bool = True

    @property
    def seconds(self) -> float:
        return self.end - self.start


def run_timeline(jobs: Sequence[JobSpan]) -> tuple[Segment, ...]:
    """The run's wall time as `Segment`s in time order, the split `measure_goodput` totals; `jobs` in any order."""
    return _timeline(sorted(jobs, key=lambda j: j.created))[0]


def _timeline(ordered: Sequence[JobSpan]) -> tuple[tuple[Segment, ...], float]:
    """The segments of `ordered` (by creation), and the steps trained again after restarts."""
    segments: list[Segment] = []
    best: float | None = None  # the highest step reached by the jobs before this one
    redone_steps = 0.0
    for index, job in enumerate(ordered):
        if index == 0 and job.begins < job.created:  # queued before its first nodes: no instance is paid for
            segments.append(Segment(index, job.begins, job.created, job.gap, held=False))
        restarts_after = index + 1 < len(ordered)
        spans, redone = _job_spans(job, best, restarts_after)
        redone_steps += redone
        segments += [Segment(index, s.start, s.end, s.category) for s in spans]
        following = ordered[index + 1] if restarts_after else None
        if following is not None and following.created > job.ended:
            segments.append(Segment(index, job.ended, following.created, following.gap, held=False))
        steps = [w.step for w in job.windows if w.step is not None]
        best = max([*steps, *([best] if best is not None else [])], default=None)
    return tuple(segments), redone_steps


def measure_goodput(run: str, jobs: Sequence[JobSpan]) -> Goodput:
    """Split the run's wall time by `Category`; `jobs` in any order (they are taken by creation time)."""
    if not jobs:
        raise ValueError(f"run {run!r} has no jobs")
    ordered = sorted(jobs, key=lambda j: j.created)
    priced = all(instance_spec(t).usd_per_hour for j in ordered for t in j.instance_types())
    empty = Total(dollars=0.0 if priced else None)
    totals = {c: empty for c in Category if c not in SCHEDULER_CATEGORIES}
    segments, redone_steps = _timeline(ordered)
    for segment in segments:
        totals.setdefault(segment.category, empty)
        if not segment.held:  # between jobs: no instance is paid for
            totals[segment.category] = totals[segment.category].plus(segment.seconds, 0.0, None)
            continue
        burn = estimate_fleet_burn(ordered[segment.attempt].instance_types(), segment.seconds)
        dollars = burn.dollars if priced else None  # a price for part of the fleet would understate it
        totals[segment.category] = totals[segment.category].plus(segment.seconds, burn.device_hours, dollars)
    stepping = [w for job in ordered for w in job.windows if w.steps > 0]
    return Goodput(
        run=run,
        jobs=tuple(j.name for j in ordered),
        wall_s=max(ordered[-1].ended - ordered[0].begins, 0.0),
        totals=totals,
        mean_tflops_per_gpu=_weighted([(w.end - w.start, w.tflops_per_gpu) for w in stepping]),
        mean_mfu=_weighted([(w.end - w.start, w.mfu) for w in stepping]),
        stalls_caught=sum(1 for j in ordered if j.stall is not None),
        final_step=max((w.step for j in ordered for w in j.windows if w.step is not None), default=None),
        redone_steps=redone_steps,
        stall_whys=tuple((j.name, j.stall_why) for j in ordered if j.stall is not None and j.stall_why),
    )


def _job_spans(job: JobSpan, best: float | None, restarts_after: bool) -> tuple[list[_Span], float]:
    """The job's time, [created, ended), as categorized spans; and how many steps it trained again."""
    active: list[_Span] = []
    redone_steps = 0.0
    cursor = job.created
    reached: float | None = None  # the step this job's previous window ended at
    for window in sorted(job.windows, key=lambda w: w.start):
        start, end = max(window.start, cursor, job.created), min(window.end, job.ended)
        previous, reached = reached, window.step if window.step is not None else reached
        if end <= start:
            continue
        if window.steps > 0:
            first, steps = _steps_from(window, previous)
            redone = min(max(best - first, 0.0), steps) if best is not None and first is not None else 0.0
            redone_steps += redone
            split = start + (end - start) * redone / steps
            active += [_Span(start, split, Category.REDONE), _Span(split, end, Category.PRODUCTIVE)]
        elif window.in_phase:
            active.append(_Span(start, end, Category.PHASES))
        else:
            continue
        cursor = end
    first_activity = min((s.start for s in active), default=job.training_started or job.ended)
    spans: list[_Span] = []
    edge = job.created
    for span in [*active, _Span(job.ended, job.ended, Category.OTHER)]:
        spans += _idle_spans(job, edge, span.start, first_activity, restarts_after)
        spans.append(span)
        edge = span.end
    return [s for s in spans if s.end > s.start], redone_steps


def _steps_from(window: Window, previous: float | None) -> tuple[float | None, float]:
    """The step `window` started from, and its steps. Its start is its `step` less its `steps`, but never below the
    step the job's previous window ended at: a datapoint stored twice (a PutMetricData retried after a lost answer)
    doubles a period's Steps, not its Step. A step lower than the previous one is a restart within the job."""
    if window.step is None:
        return None, window.steps
    first = window.step - window.steps
    if previous is not None and first < previous < window.step:
        return previous, window.step - previous
    return first, window.steps


def _idle_spans(job: JobSpan, start: float, end: float, first_activity: float, restarts_after: bool) -> list[_Span]:
    """[start, end) without steps or phases, cut where its category changes: startup, stall, after the stop."""
    cuts = {start, end}
    if job.stall is not None:
        cuts |= {t for t in job.stall if start < t < end}
    cuts |= {t for a, b, _ in job.held for t in (a, b) if start < t < end}
    if start < first_activity < end:
        cuts.add(first_activity)
    points = sorted(cuts)
    return [
        _Span(a, b, _idle_category(job, (a + b) / 2, first_activity, restarts_after))
        for a, b in itertools.pairwise(points)
    ]


def _idle_category(job: JobSpan, t: float, first_activity: float, restarts_after: bool) -> Category:
    held = next((category for a, b, category in job.held if a <= t < b), None)
    if held is not None:
        return held
    if job.stall is not None:
        onset, stop = job.stall
        if onset <= t < stop:
            return Category.STALLS
        if t >= stop:
            return Category.RESTART_GAPS if restarts_after else Category.OTHER
    return Category.STARTUP if t < first_activity else Category.OTHER


def _weighted(values: list[tuple[float, float | None]]) -> float | None:
    known = [(weight, value) for weight, value in values if value is not None and weight > 0]
    total = sum(weight for weight, _ in known)
    return sum(weight * value for weight, value in known) / total if total else None
