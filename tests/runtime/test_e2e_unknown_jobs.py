"""End to end on moto: alarms and state changes of jobs that no platform has, or that no platform could name, write
nothing to the table: the name is checked first, then the job's existence, and only then is anything written."""

from __future__ import annotations

from typing import Any

import pytest

from handlers import on_alarm, on_job_state
from stallwatch.core import alarms
from tests.fixtures.world import alarm_event, job_state_event

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


def _unconditional_writes(requests: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [op for op, params in requests if op in WRITES and "ConditionExpression" not in params]


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


def test_an_alarm_of_a_job_that_does_not_exist_writes_nothing_and_deletes_its_alarms(rt, context) -> None:
    # Given an alarm of a job SageMaker does not know (deleted, or a name typed by hand)
    name = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", "no-such-job", alarms.PROGRESS)
    requests = _table_requests(rt)

    # When on_alarm gets it
    result = on_alarm.handler(alarm_event(name), context)

    # Then it is not found, and nothing was written: no claim, no item, no unconditional delete
    assert result["status"] == "not_found"
    assert _unconditional_writes(requests) == []
    assert _items(rt) == []


def test_an_end_event_of_a_job_that_does_not_exist_writes_nothing(rt, context) -> None:
    # Given a Stopped event (the job opted in to a summary) for a job SageMaker does not know
    event = job_state_event("ghost-job", "Stopped", hosts=1, tags={"stallwatch:summary": "true"})
    requests = _table_requests(rt)

    # When on_job_state gets it
    result = on_job_state.handler(event, context)

    # Then it is not found, and nothing was written
    assert result["status"] == "not_found"
    assert _unconditional_writes(requests) == []
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
