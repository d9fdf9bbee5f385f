"""One-time EventBridge Scheduler schedules that decide a job again when the engine said its evidence turns
decisive (`Decision.recheck_at`), instead of at the next sweep.

    rechecks = RecheckScheduler(clients, RecheckTarget(group, role_arn, on_alarm_arn, dlq_arn))
    rechecks.schedule(Platform.SAGEMAKER, "llama-70b", at=1_764_500_000.5, now=1_764_499_100.0)
    # -> at(2026-11-30T10:54:00) in the group, invoking on_alarm with a `RecheckEvent`

Each job has one schedule (`schedule_name`) in the deployment's schedule group; a new time replaces the pending one
(CreateSchedule, or UpdateSchedule when the name is taken, or first when the caller knows one is pending;
UpdateSchedule replaces every field, so both send the whole request). Scheduler invokes within the minute it is
given (60-second precision), so the time is rounded up to a whole minute and is never less than `MIN_LEAD_SECONDS`
ahead: the request never names a time that has passed by the time Scheduler reads it. The schedule deletes itself
once it has invoked its target (`ActionAfterCompletion=DELETE`); one a later decision no longer needs is deleted
(`cancel`, DeleteSchedule).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.events import RECHECK_SOURCE, RecheckEvent
from stallwatch.core.signals import Platform

# CreateSchedule's own limits (Scheduler API reference): Name 1-64 characters of [0-9a-zA-Z-_.]; RetryPolicy
# MaximumEventAgeInSeconds 60-86,400 and MaximumRetryAttempts 0-185.
SCHEDULE_NAME_MAX = 64
SCHEDULE_NAME_UNSAFE = re.compile(r"[^0-9A-Za-z_-]")  # '.' separates the name's parts
NAME_HASH_CHARS = 16  # of the sha256 of platform and job: distinct jobs never share a schedule
PRECISION_SECONDS = 60  # Scheduler invokes a target between hh:mm:00 and hh:mm:59 of the minute given
MIN_LEAD_SECONDS = 60
AT_FORMAT = "%Y-%m-%dT%H:%M:%S"  # at(yyyy-mm-ddThh:mm:ss), in ScheduleExpressionTimezone
TIMEZONE = "UTC"
# A recheck not delivered within two default sweeps is the sweeper's (`engine.sweeper_due`): later, it only adds load.
MAX_EVENT_AGE_SECONDS = 600
MAX_RETRY_ATTEMPTS = 5


@dataclass(frozen=True)
class RecheckTarget:
    """Where the schedules go and what they invoke: the deployment's schedule group, the role Scheduler assumes,
    on_alarm's ARN, and the dead-letter queue of rechecks Scheduler could not deliver (None: none)."""

    group: str
    role_arn: str
    function_arn: str
    dead_letter_arn: str | None = None


@dataclass(frozen=True)
class Scheduled:
    """One recheck put in place: the schedule's name, when it fires (epoch seconds) and the call that did it."""

    name: str
    fires_at: float
    call: str  # CreateSchedule or UpdateSchedule


def schedule_name(platform: Platform, job: str) -> str:
    """The job's schedule: `<platform>.<readable job>.<hash>`, valid for Scheduler whatever the job's name holds."""
    digest = hashlib.sha256(f"{platform.value}#{job}".encode()).hexdigest()[:NAME_HASH_CHARS]
    room = SCHEDULE_NAME_MAX - len(platform.value) - NAME_HASH_CHARS - 2
    return f"{platform.value}.{SCHEDULE_NAME_UNSAFE.sub('-', job)[:room]}.{digest}"


def fire_time(at: float, now: float) -> float:
    """When Scheduler is asked to fire: `at`, no sooner than `MIN_LEAD_SECONDS` from `now`, rounded up to the minute
    (Scheduler fires within the minute, so never before `at`)."""
    earliest = max(at, now + MIN_LEAD_SECONDS)
    return math.ceil(earliest / PRECISION_SECONDS) * PRECISION_SECONDS


def at_expression(t: float) -> str:
    return f"at({datetime.fromtimestamp(t, UTC).strftime(AT_FORMAT)})"


class RecheckScheduler:
    """Upserts each job's one-time recheck schedule (the Scheduler client is created on the first one)."""

    def __init__(self, clients: AwsClients, target: RecheckTarget) -> None:
        self.clients = clients
        self.target = target

    def targeting(self, function_arn: str) -> RecheckScheduler:
        """The same schedules, invoking `function_arn`."""
        return RecheckScheduler(self.clients, replace(self.target, function_arn=function_arn))

    def schedule(self, platform: Platform, job: str, at: float, now: float, pending: bool = False) -> Scheduled:
        """Decide on the job again at `at` (epoch seconds), replacing its pending recheck if it has one. `pending`:
        the caller knows one has not fired yet, so UpdateSchedule goes first (one call where CreateSchedule would
        find the name taken). Raises what Scheduler answers (botocore's ClientError), and ValueError when no target
        is known."""
        if not self.target.function_arn:
            raise ValueError("no recheck target: on_alarm's ARN is not known")
        name = schedule_name(platform, job)
        fires_at = fire_time(at, now)
        request = self._request(name, fires_at, RecheckEvent(source=RECHECK_SOURCE, platform=platform, job=job, at=at))
        return Scheduled(name, fires_at, self._upsert(request, pending))

    def cancel(self, platform: Platform, job: str) -> bool:
        """Delete the job's pending recheck (one DeleteSchedule); False when it had none left (it fired, or was
        never created). Raises what else Scheduler answers."""
        scheduler = self.clients.scheduler
        try:
            scheduler.delete_schedule(Name=schedule_name(platform, job), GroupName=self.target.group)
        except scheduler.exceptions.ResourceNotFoundException:
            return False
        return True

    def _upsert(self, request: dict[str, Any], pending: bool) -> str:
        """The schedule created or replaced; the call that did it."""
        scheduler = self.clients.scheduler
        if pending:
            try:
                scheduler.update_schedule(**request)
                return "UpdateSchedule"
            except scheduler.exceptions.ResourceNotFoundException:  # never created (it failed) or fired meanwhile
                pass
        try:
            scheduler.create_schedule(**request)
            return "CreateSchedule"
        except scheduler.exceptions.ConflictException:  # the job's earlier recheck is pending: replaced
            pass
        try:
            scheduler.update_schedule(**request)
            return "UpdateSchedule"
        except scheduler.exceptions.ResourceNotFoundException:  # it fired and deleted itself in between
            scheduler.create_schedule(**request)
            return "CreateSchedule"

    def _request(self, name: str, fires_at: float, event: RecheckEvent) -> dict[str, Any]:
        """CreateSchedule's (and UpdateSchedule's) request, every field given."""
        target: dict[str, Any] = {
            "Arn": self.target.function_arn,
            "RoleArn": self.target.role_arn,
            "Input": event.model_dump_json(),
            "RetryPolicy": {
                "MaximumEventAgeInSeconds": MAX_EVENT_AGE_SECONDS,
                "MaximumRetryAttempts": MAX_RETRY_ATTEMPTS,
            },
        }
        if self.target.dead_letter_arn:
            target["DeadLetterConfig"] = {"Arn": self.target.dead_letter_arn}
        return {
            "Name": name,
            "GroupName": self.target.group,
            "ScheduleExpression": at_expression(fires_at),
            "ScheduleExpressionTimezone": TIMEZONE,
            "FlexibleTimeWindow": {"Mode": "OFF"},
            "ActionAfterCompletion": "DELETE",
            "State": "ENABLED",
            "Target": target,
        }
