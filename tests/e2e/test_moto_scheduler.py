"""The Scheduler extension: one-time schedules fire on the caller's clock (once, earliest first, deleted after when
asked), and moto answers a missing group and UpdateSchedule's ActionAfterCompletion as Scheduler does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import moto
import pytest
from moto.server import ThreadedMotoServer

from localrun import moto_scheduler

GROUP = "rechecks"
TARGET = "arn:aws:lambda:us-east-1:123456789012:function:on-alarm"
ROLE = "arn:aws:iam::123456789012:role/scheduler"
T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC).timestamp()


def _put(scheduler: Any, name: str, expression: str, after: str = "DELETE", update: bool = False, **extra: Any) -> None:
    request = {
        "Name": name,
        "GroupName": GROUP,
        "ScheduleExpression": expression,
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "ActionAfterCompletion": after,
        "Target": {"Arn": TARGET, "RoleArn": ROLE, "Input": json.dumps({"name": name})},
        **extra,
    }
    (scheduler.update_schedule if update else scheduler.create_schedule)(**request)


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    moto_scheduler.install()
    with moto.mock_aws():
        client = boto3.client("scheduler", region_name="us-east-1")
        client.create_schedule_group(Name=GROUP)
        yield client


@pytest.fixture
def invoked() -> list[tuple[str, dict[str, Any]]]:
    return []


@pytest.fixture
def schedules(scheduler: Any, invoked: list[tuple[str, dict[str, Any]]]) -> moto_scheduler.OneTimeSchedules:
    def invoke(arn: str, payload: dict[str, Any]) -> int:
        invoked.append((arn, payload))
        return len(invoked)

    return moto_scheduler.OneTimeSchedules(scheduler, GROUP, invoke)


def _names(scheduler: Any) -> list[str]:
    return sorted(s["Name"] for s in scheduler.list_schedules(GroupName=GROUP)["Schedules"])


def test_one_time_schedules_fire_when_due_earliest_first_then_delete_themselves(scheduler, schedules, invoked) -> None:
    # Given schedules at 10:05 and 10:02 UTC, one at 11:05 in Paris (10:05 UTC) and a rate schedule
    _put(scheduler, "late", "at(2026-11-30T10:05:00)")
    _put(scheduler, "early", "at(2026-11-30T10:02:00)")
    _put(scheduler, "paris", "at(2026-11-30T11:05:00)", ScheduleExpressionTimezone="Europe/Paris")
    _put(scheduler, "every-5", "rate(5 minutes)", after="NONE")

    # When the clock is at 10:01, then at 10:05
    assert schedules.fire_due(T0 + 60) == []
    fired = schedules.fire_due(T0 + 300)

    # Then each one-time schedule invoked its target once with its input, earliest first, and is gone
    assert [f.name for f in fired] == ["early", "late", "paris"]  # by time, then name
    assert [f.due_at for f in fired] == [T0 + 120, T0 + 300, T0 + 300]
    assert [f.result for f in fired] == [1, 2, 3]
    assert sorted(payload["name"] for _, payload in invoked) == ["early", "late", "paris"]
    assert {arn for arn, _ in invoked} == {TARGET}
    assert _names(scheduler) == ["every-5"]
    assert schedules.fire_due(T0 + 3600) == []


def test_a_schedule_kept_after_completion_fires_once_until_it_is_updated(scheduler, schedules, invoked) -> None:
    # Given a one-time schedule that is kept after it fires
    _put(scheduler, "kept", "at(2026-11-30T10:02:00)", after="NONE")

    # When it fires, and the clock moves on
    first = schedules.fire_due(T0 + 180)
    again = schedules.fire_due(T0 + 600)

    # Then it fired once and stays
    assert ([f.name for f in first], again) == (["kept"], [])
    assert _names(scheduler) == ["kept"]

    # And once updated to a new time, it fires at that time
    _put(scheduler, "kept", "at(2026-11-30T10:20:00)", after="NONE", update=True)
    assert schedules.fire_due(T0 + 1199) == []
    assert [f.name for f in schedules.fire_due(T0 + 1200)] == ["kept"]


def test_a_schedules_target_runs_after_its_own_deletion(scheduler, invoked) -> None:
    # Given a target that schedules its job's next time under the same name (a recheck asking for another)
    _put(scheduler, "job", "at(2026-11-30T10:02:00)")

    def reschedule(arn: str, payload: dict[str, Any]) -> None:
        _put(scheduler, "job", "at(2026-11-30T10:30:00)")

    schedules = moto_scheduler.OneTimeSchedules(scheduler, GROUP, reschedule)

    # When it fires, Then the new schedule is in place (the old one was deleted before the target ran)
    schedules.fire_due(T0 + 180)
    assert scheduler.get_schedule(Name="job", GroupName=GROUP)["ScheduleExpression"] == "at(2026-11-30T10:30:00)"


def test_a_schedule_in_a_group_that_does_not_exist_is_not_found(scheduler) -> None:
    with pytest.raises(scheduler.exceptions.ResourceNotFoundException, match="nowhere"):
        scheduler.create_schedule(
            Name="x",
            GroupName="nowhere",
            ScheduleExpression="at(2026-11-30T10:02:00)",
            FlexibleTimeWindow={"Mode": "OFF"},
            Target={"Arn": TARGET, "RoleArn": ROLE},
        )


def test_update_schedule_replaces_action_after_completion_as_scheduler_does(scheduler) -> None:
    # Given a schedule that deletes itself
    _put(scheduler, "job", "at(2026-11-30T10:02:00)")

    # When an update names it again, then one leaves it out
    _put(scheduler, "job", "at(2026-11-30T10:03:00)", update=True)
    named = scheduler.get_schedule(Name="job", GroupName=GROUP)["ActionAfterCompletion"]
    request = {"Name": "job", "GroupName": GROUP, "ScheduleExpression": "at(2026-11-30T10:04:00)"}
    scheduler.update_schedule(**request, FlexibleTimeWindow={"Mode": "OFF"}, Target={"Arn": TARGET, "RoleArn": ROLE})

    # Then the first keeps DELETE, the second resets it to NONE (moto alone would keep DELETE) and it stays enabled
    assert named == "DELETE"
    updated = scheduler.get_schedule(Name="job", GroupName=GROUP)
    assert (updated["ActionAfterCompletion"], updated["State"]) == ("NONE", "ENABLED")


def test_the_extension_works_over_a_threaded_moto_server(monkeypatch) -> None:
    # Given the extension behind a moto server on 127.0.0.1, as the demo runs it
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    moto_scheduler.install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        scheduler = boto3.client("scheduler", region_name="us-east-1", endpoint_url=f"http://{host}:{port}")
        scheduler.create_schedule_group(Name=GROUP)
        _put(scheduler, "job", "at(2026-11-30T10:02:00)")
        _put(scheduler, "job", "at(2026-11-30T10:03:00)", after="NONE", update=True)
        fired = moto_scheduler.OneTimeSchedules(scheduler, GROUP, lambda arn, payload: payload).fire_due(T0 + 180)

        # Then the update's ActionAfterCompletion holds, and the schedule fires over HTTP
        assert [(f.name, f.result) for f in fired] == [("job", {"name": "job"})]
        assert scheduler.get_schedule(Name="job", GroupName=GROUP)["ActionAfterCompletion"] == "NONE"
        with pytest.raises(scheduler.exceptions.ResourceNotFoundException):
            scheduler.get_schedule(Name="job", GroupName="nowhere")
    finally:
        server.stop()
