"""AWS Health's scheduled events for the EC2 instances training jobs run on: what Slack and `stallwatch status` are
told of one, and when a job that opted in is moved off the instance, before the event's window.

Pure. An EC2 scheduled change (a retirement, a stop, a reboot, maintenance) names its instances and its window. A
watched job whose host is one of them hears it; one that opted in (`PlatformDescription.way_back`) is moved off the
host at a quiet moment: right after a checkpoint ends within `QUIET_SPAN_S` of the window, else `MOVE_LEAD_S` before
it, within its restart budget (the resume's and recovery's, `plan_move`).

    notice = HostNotice(event_arn, code, instance, host, start, end, received_at, move="restart")
    notice_text(job, notice, checkpoint_t, now, plan)    # Slack's words (escaped by aws.slack's builders)
    status_line(notice, now)                              # `stallwatch status`'s line for it
    move_due(notice.start, now, checkpoint_t)             # why the move is due now, or None
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from stallwatch.core.resume import NoResume, ResumeTagError, max_restarts
from stallwatch.core.way_back import DEFAULT_RESTARTS, WayBack

MOVE_LEAD_S = 3600.0  # moved at the latest this long before the window: a replacement node and a restart fit in it
QUIET_SPAN_S = 86_400.0  # within this long of the window, the end of a checkpoint is the moment to move
FRESH_CHECKPOINT_S = 600.0  # a checkpoint that ended this recently (two sweeps): little is lost by restarting now
DESCRIPTION_CHARS = 300  # of AWS's own words for the event, in Slack
MOVE_ACTION = "move"  # the audit records of a move off a host (`action`)
MOVE_DIAGNOSIS = "host_event"  # a way back that moves a job off a host before its scheduled event, not a stall's
NOTICE_ACTION = "host_event"  # the audit record of a job told of an event

# Where a notice is: told only (not opted in, or a platform that never moves), a move planned, under way, done or not,
# called off (AWS closed the event, or the job ended before its window).
TOLD, PLANNED, MOVING, MOVED, NOT_MOVED, CANCELLED = "told", "planned", "moving", "moved", "not_moved", "cancelled"
# What the event does to the instance, from its code's words (AWS adds codes; an unknown one is named as it is).
IMPACTS = (
    ("RETIREMENT", "retirement"),
    ("TERMINATION", "termination"),
    ("STOP", "stop"),
    ("REBOOT", "reboot"),
    ("MAINTENANCE", "maintenance"),
)


@dataclass(frozen=True)
class HostNotice:
    """One AWS Health event as it concerns one job's host: the event, the window, and what Stallwatch does about it."""

    event_arn: str
    code: str  # eventTypeCode, e.g. AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED
    instance: str  # the EC2 instance the event names
    host: str  # the job's host on it (the instance id on EC2, the Slurm node)
    start: float  # the window's start (epoch seconds)
    end: float | None  # its end, where AWS gives one
    received_at: float
    move: str = ""  # how the job is moved off (`PlatformDescription.way_back`), "" when it is not
    state: str = TOLD
    detail: str = ""  # why it is not moved, or how it was
    description: str = ""  # AWS's own words (latestDescription), cut to `DESCRIPTION_CHARS`

    def with_state(self, state: str, detail: str = "") -> HostNotice:
        return replace(self, state=state, detail=detail)

    @property
    def over_at(self) -> float:
        """When the event no longer concerns the job: its window's end, else its start."""
        return self.end if self.end is not None else self.start

    def as_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def of_json(cls, data: Mapping[str, Any]) -> HostNotice:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


def impact(code: str) -> str:
    """ "retirement", "reboot", ...: what the event does to the instance, as its code says."""
    return next((words for part, words in IMPACTS if part in code), code)


def move_due(start: float, now: float, checkpoint_t: float | None) -> str | None:
    """Why a planned move is due now (a quiet moment before the window), or None: `MOVE_LEAD_S` before the window at
    the latest; before that, within `QUIET_SPAN_S` of it, right after a checkpoint ended (`checkpoint_t`)."""
    if now >= start - MOVE_LEAD_S:
        return f"the window is {_span(max(start - now, 0.0))} away"
    fresh = checkpoint_t is not None and 0.0 <= now - checkpoint_t <= FRESH_CHECKPOINT_S
    if now >= start - QUIET_SPAN_S and fresh:
        assert checkpoint_t is not None
        return f"a checkpoint ended {_span(now - checkpoint_t)} ago"
    return None


def watching(start: float, now: float) -> bool:
    """Whether a planned move watches the job's checkpoints now (within `QUIET_SPAN_S` of the window)."""
    return now >= start - QUIET_SPAN_S


def plan_move(tags: Mapping[str, str], default_max_restarts: int, done: int) -> tuple[int, int] | NoResume:
    """(the restart a move makes, the restarts allowed), or why there is none: the run's budget, as for resume and
    recovery (`stallwatch:resume`, else the policy's default, else `DEFAULT_RESTARTS`), `done` used."""
    try:
        allowed = max_restarts(dict(tags), default_max_restarts or DEFAULT_RESTARTS)
    except ResumeTagError as exc:
        return NoResume(f"not moved: {exc}", alert=True)
    if allowed == 0:
        return NoResume("not moved: restarts are off for this job (stallwatch:resume=0)", alert=True)
    if done >= allowed:
        return NoResume(f"not moved: restart budget spent ({done} of {allowed} restarts)", alert=True)
    return done + 1, allowed


# ---- what Slack and `stallwatch status` are told ------------------------------------------------------------------


def notice_text(job: str, notice: HostNotice, checkpoint_t: float | None, now: float, plan: str) -> str:
    """The first message about an event: the instance, the event, the window, the last checkpoint's age, the plan."""
    on = notice.instance if notice.host == notice.instance else f"{notice.instance} (node {notice.host})"
    lines = [
        f":calendar: `{job}`: AWS Health scheduled the {impact(notice.code)} of {on} ({notice.code}), "
        f"{window_text(notice, now)}",
        f"- last checkpoint: {checkpoint_text(checkpoint_t, now)}",
        f"- {plan}",
    ]
    if notice.description:
        lines.append(f"- AWS: {notice.description}")
    return "\n".join(lines)


def window_text(notice: HostNotice, now: float) -> str:
    until = f" to {when(notice.end)}" if notice.end is not None else ""
    start = notice.start - now
    relative = f"in {_span(start)}" if start > 0 else f"began {_span(-start)} ago"
    return f"window {when(notice.start)}{until} ({relative})"


def checkpoint_text(checkpoint_t: float | None, now: float) -> str:
    if checkpoint_t is None:
        return "none seen (no checkpoint's end line in its logs' last hours)"
    return f"{_span(max(now - checkpoint_t, 0.0))} ago (its end line)"


def plan_text(notice: HostNotice, opt_in: str) -> str:
    """What will be done: the move and when, or why not (`opt_in`: the tags that would move the job)."""
    if notice.state == PLANNED:
        how = "restarted in place without it" if notice.move == WayBack.RESTART else "requeued with the node drained"
        latest = when(notice.start - MOVE_LEAD_S)
        return f"it will be {how} right after its next checkpoint, by {latest} at the latest"
    if notice.detail:
        return notice.detail
    return f"it will not be moved off: tag it {opt_in} to move it before the window" if opt_in else "no move"


def status_line(notice: HostNotice, now: float) -> str:
    """ "host event: i-0abc AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED, window ... ; move planned (...)"."""
    on = notice.instance if notice.host == notice.instance else f"{notice.instance} (node {notice.host})"
    state = {
        TOLD: "not moved (not opted in)",
        PLANNED: f"move planned ({notice.move}), by {when(notice.start - MOVE_LEAD_S)} at the latest",
        MOVING: f"moving off ({notice.move})",
        MOVED: "moved off",
        NOT_MOVED: "not moved",
        CANCELLED: "called off",
    }.get(notice.state, notice.state)
    detail = f": {notice.detail}" if notice.detail else ""
    return f"host event: {on} {notice.code}, {window_text(notice, now)}; {state}{detail}"


def when(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _span(seconds: float) -> str:
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"
