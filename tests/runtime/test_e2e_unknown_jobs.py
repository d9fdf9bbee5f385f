"""End to end on moto: alarms and state changes of jobs that no platform has, or that no platform could name, write
nothing to the table, not even a conditional write that fails: the name is checked first, then the job's
existence, and only then is anything written."""

from __future__ import annotations

from typing import Any

import pytest

from handlers import on_alarm, on_job_state
from localrun.moto_world import alarm_event, instance_state_event, job_state_event
from stallwatch.core import alarms

WRITES = ("PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem")


def _table_requests(rt) -> list[tuple[str, dict[str, Any]]]:
    """Every DynamoDB request the runtime makes from now on: (operation, parameters)."""
    requests: list[tuple[str, dict[str, Any]]] = []
    rt.clients.dynamodb.meta.events.register(
        "provide-client-params.dynamodb.*",
        lambda params, model, **_: requests.append((model.name, dict(params))),
    )
    return requests


def _platform_calls(rt) -> list[str]:
    calls: list[str] = []
    for client in (rt.clients.sagemaker, rt.clients.ec2, rt.clients.cloudwatch, rt.clients.logs):
        client.meta.events.register("before-call", lambda model, **_: calls.append(model.name))
    return calls


def _items(rt) -> list[dict[str, Any]]:
    return rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"]


def _writes(requests: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Every write request, conditional ones included (a failed condition is still a write request, and costs one)."""
    return [op for op, _ in requests if op in WRITES]


@pytest.mark.parametrize(
    "job",
    ["nul\x00job", "has space", "caf\u00e9-job", "x" * 64, "a-" * 32 + "b", "-leading-hyphen", "under_score"],
    ids=["nul", "space", "unicode", "64-chars", "65-chars-of-hyphens", "leading-hyphen", "underscore-on-sagemaker"],
)
def test_an_alarm_naming_a_job_no_platform_allows_is_ignored_before_any_read_or_write(rt, context, job) -> None:
    # Given an alarm under this deployment's prefix whose job part SageMaker would never accept
    name = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, alarms.PROGRESS)
    requests, calls = _table_requests(rt), _platform_calls(rt)

    # When on_alarm gets it
    result = on_alarm.handler(alarm_event(name), context)

    # Then it is ignored with the reason, and neither the table nor any platform was asked anything
    assert result["status"] == "ignored"
    assert "cannot name a SageMaker job" in result["details"]["reason"]
    assert (requests, calls) == ([], [])


@pytest.mark.parametrize(
    ("platform", "job", "kind"),
    [("sagemaker", "no-such-job", alarms.PROGRESS), ("ec2", "i-0123456789abcdef0", alarms.GPU_IDLE)],
)
def test_an_alarm_of_a_job_that_does_not_exist_writes_nothing_and_deletes_its_alarms(
    rt, context, platform, job, kind
) -> None:
    # Given an alarm of a job the platform does not know (deleted, or a name typed by hand)
    host = "i-0123456789abcdef0" if platform == "ec2" else None
    name = alarms.alarm_name(rt.config.alarm_prefix, platform, job, kind, host)
    requests = _table_requests(rt)

    # When on_alarm gets it
    result = on_alarm.handler(alarm_event(name), context)

    # Then it is not found, and nothing was written: no claim, no item, no delete
    assert result["status"] == "not_found"
    assert _writes(requests) == []
    assert _items(rt) == []


def test_an_alarm_of_a_job_the_table_knows_but_the_platform_no_longer_has_writes_nothing(rt, world, context) -> None:
    # Given a job decided once (its state item and alarm marker in the table), whose instances are gone since
    instance = "i-0abcdef0123456789"
    rt.alarm_markers.mark(f"job#ec2#{instance}", 3, 3, rt.clock())
    rt.states.claim_decision(f"job#ec2#{instance}", rt.clock(), 0)
    before = _items(rt)
    name = alarms.alarm_name(rt.config.alarm_prefix, "ec2", instance, alarms.GPU_MEMORY, instance)
    requests = _table_requests(rt)

    # When one of its alarms fires
    result = on_alarm.handler(alarm_event(name), context)

    # Then the job is not found before anything is claimed: the table is as it was
    assert result["status"] == "not_found"
    assert _writes(requests) == []
    assert _items(rt) == before


def test_an_end_event_of_a_job_that_does_not_exist_writes_nothing(rt, context) -> None:
    # Given a Stopped event (the job opted in to a summary) for a job SageMaker does not know
    event = job_state_event("ghost-job", "Stopped", hosts=1, tags={"stallwatch:summary": "true"})
    requests = _table_requests(rt)

    # When on_job_state gets it
    result = on_job_state.handler(event, context)

    # Then it is not found, and nothing was written
    assert result["status"] == "not_found"
    assert _writes(requests) == []
    assert _items(rt) == []


def test_a_state_change_of_an_instance_that_does_not_exist_writes_nothing(rt, context) -> None:
    # Given a "terminated" event of an instance EC2 does not know (a made-up event, or one an hour late)
    requests = _table_requests(rt)

    # When on_job_state gets it
    on_job_state.handler(instance_state_event("i-0fedcba9876543210", "terminated"), context)

    # Then nothing was written: no marker delete, no state (only reads, to find nothing)
    assert _writes(requests) == []
    assert _items(rt) == []


def test_the_first_alarm_of_a_running_job_is_still_decided_and_its_burst_read_once(rt, world, context) -> None:
    # Given a running job never decided before
    world.create_job("fresh-job", hosts=1)
    describes = []
    rt.clients.sagemaker.meta.events.register(
        "before-call.sagemaker.DescribeTrainingJob", lambda **_: describes.append(1)
    )
    name = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", "fresh-job", alarms.PROGRESS)

    # When two of its alarms fire together
    statuses = [on_alarm.handler(alarm_event(name, ts), context)["status"] for ts in ("2026-11-30T10:00:00Z",) * 2]

    # Then the first is decided (the job was checked once, before its first write) and the second coalesced
    assert statuses == ["decided", "coalesced"]
    assert len(describes) == 1
