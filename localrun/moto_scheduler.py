"""A small moto extension: EventBridge Scheduler's one-time schedules fire, and its requests fail as Scheduler's do.

moto 5.2.5 stores schedules but never fires them. `OneTimeSchedules.fire_due(now)` does what Scheduler does at
`now`: each enabled `at(...)` schedule of the group whose time has come invokes its target with its `Input`, once,
and is deleted if its `ActionAfterCompletion` is DELETE (before the target runs, as after an asynchronous invoke).
`now` is the caller's clock (a test's, the demo's). `install()` fixes two answers: a schedule in a group that does
not exist is ResourceNotFoundException (moto raises a KeyError), and UpdateSchedule replaces
`ActionAfterCompletion` too (moto keeps the old value; Scheduler takes what the request says, NONE when it says
nothing) and leaves a schedule ENABLED when the request names no `State` (moto leaves it without one).

    from localrun import moto_scheduler
    moto_scheduler.install()
    schedules = moto_scheduler.OneTimeSchedules(boto3.client("scheduler"), "stallwatch-rechecks", invoke)
    schedules.fire_due(time.time())   # invoke(target_arn, payload) for each schedule that came due
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from moto.scheduler.exceptions import ScheduleGroupNotFound
from moto.scheduler.models import EventBridgeSchedulerBackend, Schedule
from moto.scheduler.responses import EventBridgeSchedulerResponse

AT_EXPRESSION = re.compile(r"^at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)$")
DEFAULT_ACTION_AFTER_COMPLETION = "NONE"
DEFAULT_STATE = "ENABLED"
# UpdateSchedule's fields that moto's Schedule.update takes, by request name
UPDATED_FIELDS = {
    "description": "Description",
    "end_date": "EndDate",
    "flexible_time_window": "FlexibleTimeWindow",
    "kms_key_arn": "KmsKeyArn",
    "schedule_expression": "ScheduleExpression",
    "schedule_expression_timezone": "ScheduleExpressionTimezone",
    "start_date": "StartDate",
    "state": "State",
    "target": "Target",
}

_original_create: Any = None


def _create_schedule(self: EventBridgeSchedulerBackend, **kwargs: Any) -> Schedule:
    group = kwargs.get("group_name") or "default"
    if group not in self.schedule_groups:
        raise ScheduleGroupNotFound(group)
    return _original_create(self, **kwargs)


def _update_schedule(self: EventBridgeSchedulerResponse) -> str:
    """moto's UpdateSchedule, replacing ActionAfterCompletion too, and defaulting what the request leaves out as
    Scheduler does (State ENABLED, ActionAfterCompletion NONE)."""
    name = self.uri.split("?")[0].split("/")[-1]
    schedule = self.scheduler_backend.get_schedule(self._get_param("GroupName"), name)
    schedule.update(**{field: self._get_param(param) for field, param in UPDATED_FIELDS.items()})
    schedule.state = schedule.state or DEFAULT_STATE
    schedule.action_after_completion = self._get_param("ActionAfterCompletion") or DEFAULT_ACTION_AFTER_COMPLETION
    return json.dumps({"ScheduleArn": schedule.arn})


def install() -> None:
    """Patch moto (idempotent): a missing group, and UpdateSchedule's ActionAfterCompletion and State, as Scheduler
    answers."""
    global _original_create
    if _original_create is None:
        _original_create = EventBridgeSchedulerBackend.create_schedule
        EventBridgeSchedulerBackend.create_schedule = _create_schedule  # type: ignore[method-assign]
        EventBridgeSchedulerResponse.update_schedule = _update_schedule  # type: ignore[method-assign]


@dataclass(frozen=True)
class Fired:
    """One schedule that came due: its name, when it was due (epoch seconds) and what its target returned."""

    name: str
    due_at: float
    result: Any


class OneTimeSchedules:
    """Fires a schedule group's one-time schedules on the caller's clock; rate and cron schedules never fire here."""

    def __init__(self, scheduler: Any, group: str, invoke: Callable[[str, dict[str, Any]], Any]) -> None:
        self.scheduler = scheduler
        self.group = group
        self.invoke = invoke  # (target ARN, payload) -> the target's answer
        self._fired: set[tuple[str, datetime]] = set()  # (name, last modified): a kept schedule fires once

    def fire_due(self, now: float) -> list[Fired]:
        """Every enabled one-time schedule due at `now`, earliest first: deleted per its ActionAfterCompletion, then
        its target invoked."""
        described = self._described()
        due = sorted((t, name) for name, s in described.items() if (t := _due_at(s)) is not None and t <= now)
        fired = []
        for due_at, name in due:
            schedule = described[name]
            self._fired.add((name, schedule["LastModificationDate"]))
            # Deleted before the target runs, as it most likely is on AWS: a Lambda target runs after Scheduler's
            # asynchronous Invoke, which the deletion follows (docs/lambdas.md, Rechecks: the race left open).
            if (schedule.get("ActionAfterCompletion") or DEFAULT_ACTION_AFTER_COMPLETION) == "DELETE":
                self.scheduler.delete_schedule(Name=name, GroupName=self.group)
            target = schedule["Target"]
            fired.append(Fired(name, due_at, self.invoke(target["Arn"], json.loads(target.get("Input") or "{}"))))
        return fired

    def _described(self) -> dict[str, dict[str, Any]]:
        pages = self.scheduler.get_paginator("list_schedules").paginate(GroupName=self.group, State="ENABLED")
        names = [s["Name"] for page in pages for s in page["Schedules"]]
        described = {name: self.scheduler.get_schedule(Name=name, GroupName=self.group) for name in names}
        return {n: s for n, s in described.items() if (n, s["LastModificationDate"]) not in self._fired}


def _due_at(schedule: dict[str, Any]) -> float | None:
    """When a one-time schedule is due (epoch seconds), in its timezone; None for rate and cron schedules."""
    match = AT_EXPRESSION.match(schedule["ScheduleExpression"])
    if match is None:
        return None
    zone = ZoneInfo(schedule.get("ScheduleExpressionTimezone") or "UTC")
    return datetime.fromisoformat(match.group(1)).replace(tzinfo=zone).timestamp()
