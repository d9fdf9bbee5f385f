"""The recheck adapter's requests to EventBridge Scheduler: valid names for any job, times Scheduler fires at (never
before the engine's, never in the past), create then update with every field, and the Scheduler API's limits."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import botocore.session
import pytest

from localrun.moto_world import ALARM_ACTION_ARN, RECHECK_DEAD_LETTER_ARN, RECHECK_GROUP, RECHECK_ROLE_ARN
from stallwatch.aws.events import OnAlarmEvent, RecheckEvent, parse_event
from stallwatch.aws.rechecks import (
    MIN_LEAD_SECONDS,
    RecheckScheduler,
    RecheckTarget,
    at_expression,
    fire_time,
    schedule_name,
)
from stallwatch.core.signals import Platform

NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC).timestamp()
SCHEDULE_NAME = re.compile(r"^[0-9a-zA-Z-_.]{1,64}$")  # CreateSchedule Name, as the API reference gives it


def _requests(scheduler: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every Scheduler request from now on: (operation, parameters as sent)."""
    sent: list[tuple[str, dict[str, Any]]] = []
    scheduler.meta.events.register(
        "before-parameter-build.scheduler", lambda model, params, **_: sent.append((model.name, dict(params)))
    )
    return sent


def _schedules(rt) -> list[dict[str, Any]]:
    scheduler = rt.clients.scheduler
    names = [s["Name"] for s in scheduler.list_schedules(GroupName=RECHECK_GROUP)["Schedules"]]
    described = [scheduler.get_schedule(Name=name, GroupName=RECHECK_GROUP) for name in names]
    return [{k: v for k, v in schedule.items() if k != "ResponseMetadata"} for schedule in described]


@pytest.fixture
def adapter(rt) -> RecheckScheduler:
    rt.clients.scheduler.create_schedule_group(Name=RECHECK_GROUP)
    target = RecheckTarget(RECHECK_GROUP, RECHECK_ROLE_ARN, ALARM_ACTION_ARN, RECHECK_DEAD_LETTER_ARN)
    return RecheckScheduler(rt.clients, target)


@pytest.mark.parametrize(
    ("platform", "job"),
    [
        (Platform.SAGEMAKER, "llama-70b-pretrain"),
        (Platform.SAGEMAKER, "a" * 63),
        (Platform.EC2, "i-0123456789abcdef0"),
        (Platform.EC2, "team/llama 70b: run #3 (ünïcode) " + "x" * 220),
        (Platform.EC2, "..."),
    ],
)
def test_schedule_names_are_valid_for_scheduler_whatever_the_job_is_named(platform: Platform, job: str) -> None:
    # When a job's schedule is named; Then the name is Scheduler's (1-64 of [0-9a-zA-Z-_.]) and stable
    name = schedule_name(platform, job)
    assert SCHEDULE_NAME.match(name), name
    assert name == schedule_name(platform, job)


def test_a_schedule_name_says_whose_it_is() -> None:
    assert schedule_name(Platform.SAGEMAKER, "llama-70b-pretrain").startswith("sagemaker.llama-70b-pretrain.")
    assert schedule_name(Platform.EC2, "team/run 3").startswith("ec2.team-run-3.")


def test_jobs_that_share_a_long_prefix_or_a_name_on_two_platforms_get_their_own_schedules() -> None:
    long_a, long_b = "x" * 60 + "-a", "x" * 60 + "-b"
    names = {
        schedule_name(Platform.EC2, long_a),
        schedule_name(Platform.EC2, long_b),
        schedule_name(Platform.EC2, "job-1"),
        schedule_name(Platform.SAGEMAKER, "job-1"),
        schedule_name(Platform.EC2, "job.1"),
        schedule_name(Platform.EC2, "job-1 "),
    }
    assert len(names) == 6


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        (NOW + 600, NOW + 600),  # on a whole minute, 10 minutes ahead: that minute
        (NOW + 600.001, NOW + 660),  # just past a minute: the next one (Scheduler fires within the minute given)
        (NOW + 599, NOW + 600),
        (NOW + 20, NOW + 60),  # sooner than a minute ahead: a minute ahead
        (NOW - 3600, NOW + 60),  # in the past: a minute ahead, never a time that has passed
    ],
)
def test_the_time_asked_is_rounded_up_to_a_whole_minute_at_least_a_minute_ahead(at: float, expected: float) -> None:
    assert fire_time(at, NOW) == expected


@pytest.mark.parametrize("now_offset", [0.0, 0.4, 29.9, 59.999])
@pytest.mark.parametrize("ahead", [-86_400.0, -1.0, 0.0, 0.5, 59.0, 61.0, 119.5, 3_599.9])
def test_scheduler_never_fires_before_the_time_asked_nor_sooner_than_a_minute(now_offset: float, ahead: float) -> None:
    now = NOW + now_offset
    fires = fire_time(now + ahead, now)
    assert fires % 60 == 0
    assert fires >= now + ahead
    assert fires >= now + MIN_LEAD_SECONDS
    assert fires - max(now + ahead, now + MIN_LEAD_SECONDS) < 60
    assert at_expression(fires) == f"at({datetime.fromtimestamp(fires, UTC):%Y-%m-%dT%H:%M:00})"


def test_a_first_recheck_creates_a_one_time_schedule_that_deletes_itself(rt, adapter) -> None:
    # When a job's first recheck is scheduled for 10:14:30 (asked at 10:00)
    scheduled = adapter.schedule(Platform.SAGEMAKER, "llama-70b", NOW + 870, NOW)

    # Then one schedule fires on_alarm at 10:15 UTC with the recheck as its input, exactly then, once
    assert scheduled.call == "CreateSchedule"
    [schedule] = _schedules(rt)
    assert schedule["Name"] == scheduled.name == schedule_name(Platform.SAGEMAKER, "llama-70b")
    assert schedule["GroupName"] == RECHECK_GROUP
    assert schedule["ScheduleExpression"] == "at(2026-11-30T10:15:00)"
    assert schedule["ScheduleExpressionTimezone"] == "UTC"
    assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert schedule["ActionAfterCompletion"] == "DELETE"
    assert schedule["State"] == "ENABLED"
    target = schedule["Target"]
    assert (target["Arn"], target["RoleArn"]) == (ALARM_ACTION_ARN, RECHECK_ROLE_ARN)
    assert target["DeadLetterConfig"] == {"Arn": RECHECK_DEAD_LETTER_ARN}
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 600, "MaximumRetryAttempts": 5}

    # And on_alarm reads the input as the recheck asked for, at the engine's time (not the rounded one)
    event = parse_event(json.loads(target["Input"]), OnAlarmEvent)
    assert event == RecheckEvent(
        source="stallwatch.recheck", platform=Platform.SAGEMAKER, job="llama-70b", at=NOW + 870
    )


def test_a_new_time_replaces_the_pending_recheck_with_a_whole_request(rt, adapter) -> None:
    # Given a job's pending recheck at 10:15
    adapter.schedule(Platform.EC2, "i-0123456789abcdef0", NOW + 870, NOW)
    sent = _requests(rt.clients.scheduler)

    # When the engine asks for 10:30 instead
    scheduled = adapter.schedule(Platform.EC2, "i-0123456789abcdef0", NOW + 1800, NOW + 60)

    # Then CreateSchedule finds the name taken and UpdateSchedule replaces it, sending every field again (it resets
    # what it is not given), so the job still has one schedule, at the new time, deleting itself after
    assert [op for op, _ in sent] == ["CreateSchedule", "UpdateSchedule"]
    assert sent[0][1] == sent[1][1]
    assert scheduled.call == "UpdateSchedule"
    [schedule] = _schedules(rt)
    assert schedule["ScheduleExpression"] == "at(2026-11-30T10:30:00)"
    assert schedule["ActionAfterCompletion"] == "DELETE"
    assert json.loads(schedule["Target"]["Input"])["at"] == NOW + 1800


def test_a_recheck_known_to_be_pending_is_updated_in_one_call(rt, adapter) -> None:
    # Given a job's pending recheck at 10:15
    adapter.schedule(Platform.SAGEMAKER, "job-1", NOW + 870, NOW)
    sent = _requests(rt.clients.scheduler)

    # When the caller, knowing it has not fired, asks for 10:30 instead
    scheduled = adapter.schedule(Platform.SAGEMAKER, "job-1", NOW + 1800, NOW + 60, pending=True)

    # Then one UpdateSchedule replaces it
    assert [op for op, _ in sent] == ["UpdateSchedule"]
    assert scheduled.call == "UpdateSchedule"
    assert [s["ScheduleExpression"] for s in _schedules(rt)] == ["at(2026-11-30T10:30:00)"]


def test_a_recheck_thought_pending_that_is_not_there_is_created(rt, adapter) -> None:
    # Given no schedule for the job (its first CreateSchedule failed, or it fired), though its state says one is due
    sent = _requests(rt.clients.scheduler)

    # When a new time is asked
    scheduled = adapter.schedule(Platform.SAGEMAKER, "job-1", NOW + 1800, NOW, pending=True)

    # Then UpdateSchedule finds none, and CreateSchedule puts it in place
    assert [op for op, _ in sent] == ["UpdateSchedule", "CreateSchedule"]
    assert scheduled.call == "CreateSchedule"
    assert [s["ScheduleExpression"] for s in _schedules(rt)] == ["at(2026-11-30T10:30:00)"]


def test_a_recheck_that_fired_and_deleted_itself_meanwhile_is_created_again(rt, adapter) -> None:
    # Given a pending recheck that Scheduler fires and deletes between CreateSchedule's conflict and UpdateSchedule
    adapter.schedule(Platform.SAGEMAKER, "job-1", NOW + 120, NOW)
    name = schedule_name(Platform.SAGEMAKER, "job-1")

    def fired_meanwhile(**_: Any) -> None:
        rt.clients.scheduler.meta.events.unregister("before-call.scheduler.UpdateSchedule", fired_meanwhile)
        rt.clients.scheduler.delete_schedule(Name=name, GroupName=RECHECK_GROUP)

    rt.clients.scheduler.meta.events.register("before-call.scheduler.UpdateSchedule", fired_meanwhile)

    # When a new time is asked
    scheduled = adapter.schedule(Platform.SAGEMAKER, "job-1", NOW + 900, NOW + 60)

    # Then the recheck is created again, at the new time
    assert scheduled.call == "CreateSchedule"
    [schedule] = _schedules(rt)
    assert schedule["ScheduleExpression"] == "at(2026-11-30T10:15:00)"


def test_without_a_dead_letter_queue_the_target_names_none(rt) -> None:
    rt.clients.scheduler.create_schedule_group(Name=RECHECK_GROUP)
    adapter = RecheckScheduler(rt.clients, RecheckTarget(RECHECK_GROUP, RECHECK_ROLE_ARN, ALARM_ACTION_ARN))
    adapter.schedule(Platform.SAGEMAKER, "job-1", NOW + 900, NOW)
    [schedule] = _schedules(rt)
    assert "DeadLetterConfig" not in schedule["Target"]


def test_without_a_target_nothing_is_requested(rt) -> None:
    rt.clients.scheduler.create_schedule_group(Name=RECHECK_GROUP)
    adapter = RecheckScheduler(rt.clients, RecheckTarget(RECHECK_GROUP, RECHECK_ROLE_ARN, ""))
    sent = _requests(rt.clients.scheduler)
    with pytest.raises(ValueError, match="target"):
        adapter.schedule(Platform.SAGEMAKER, "job-1", NOW + 900, NOW)
    assert sent == []
    # And once the invoked function names itself, the same schedules target it
    adapter.targeting(ALARM_ACTION_ARN).schedule(Platform.SAGEMAKER, "job-1", NOW + 900, NOW)
    assert [s["Target"]["Arn"] for s in _schedules(rt)] == [ALARM_ACTION_ARN]


def _violations(shape: Any, value: Any, path: str) -> list[str]:
    """Where `value` breaks the API model's documented limits (length, range, pattern, enum, required members)."""
    meta, found = shape.metadata, []
    if shape.type_name == "structure":
        found += [f"{path}.{m}: required" for m in shape.required_members if m not in value]
        found += [f"{path}.{k}: unknown" for k in value if k not in shape.members]
        for key, member in value.items():
            if key in shape.members:
                found += _violations(shape.members[key], member, f"{path}.{key}")
        return found
    if shape.type_name == "string":
        if not meta.get("min", 0) <= len(value) <= meta.get("max", len(value)):
            found.append(f"{path}: length {len(value)} outside {meta.get('min')}-{meta.get('max')}")
        if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
            found.append(f"{path}: {value!r} does not match {meta['pattern']}")
        if shape.enum and value not in shape.enum:
            found.append(f"{path}: {value!r} not one of {shape.enum}")
    if shape.type_name == "integer" and not meta.get("min", value) <= value <= meta.get("max", value):
        found.append(f"{path}: {value} outside {meta.get('min')}-{meta.get('max')}")
    return found


@pytest.mark.parametrize("job", ["llama-70b-pretrain", "b" * 63])
def test_every_request_is_within_the_scheduler_api_references_limits(rt, adapter, job: str) -> None:
    # Given the Scheduler API model botocore ships (the API reference's lengths, ranges, patterns and enums)
    model = botocore.session.get_session().get_service_model("scheduler")
    adapter.schedule(Platform.SAGEMAKER, job, NOW + 900, NOW)
    sent = _requests(rt.clients.scheduler)

    # When a recheck is created and then moved
    adapter.schedule(Platform.SAGEMAKER, job, NOW + 1800, NOW + 60)

    # Then each request keeps to every documented limit (moto would accept far more)
    assert [op for op, _ in sent] == ["CreateSchedule", "UpdateSchedule"]
    for operation, params in sent:
        assert _violations(model.operation_model(operation).input_shape, params, operation) == []
