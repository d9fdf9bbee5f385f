"""End to end on moto: modes, duplicated and malformed events, Slack down, throttling."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from moto.core.botocore_stubber import MockRawResponse

from handlers import on_alarm, on_job_state
from localrun.moto_world import MINUTE, alarm_event, all_alarms, job_state_event, scheduled_event
from stallwatch.aws.events import InvalidEventError
from stallwatch.aws.job_states import ConcurrentDecisionError, StoredState
from stallwatch.aws.store import job_key
from stallwatch.core import alarms
from stallwatch.core.decision import JobState
from stallwatch.runtime import decide
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, audits, seed_nccl_hang

JOB = "mistral-7b-ft"


def test_notify_mode_alerts_and_never_stops(rt, world, slack, context) -> None:
    # Given a hung job in notify mode
    seed_nccl_hang(world, JOB, {"stallwatch:mode": "notify"})

    # When its alarm fires, and fires again (new transition) long after the stop grace period
    first = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(10 * MINUTE)
    second = on_alarm.handler(alarm_event(_alarm(rt, JOB), timestamp="2026-11-30T10:10:00.000+0000"), context)

    # Then it is alerted with what enforce would do, and never stopped
    assert (first["action"], first["posted"]) == ("alert", True)
    assert "stopped" not in first
    assert "enforce would warn" in slack.texts()[0]
    assert second["action"] in ("alert", "none")
    assert world.status(JOB) == "InProgress"
    assert all("Stopped stalled job" not in text for text in slack.texts())


def test_off_mode_does_nothing_at_all(rt, world, slack, context) -> None:
    # Given a hung job with mode off
    seed_nccl_hang(world, JOB, {"stallwatch:mode": "off"})

    # When its job state event arrives and an old alarm of it fires
    provisioned = on_job_state.handler(job_state_event(JOB, "InProgress"), context)
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)

    # Then no alarm is created, nothing is decided, posted, stopped or audited
    assert provisioned["status"] == "off"
    assert all_alarms(rt.clients.cloudwatch, AlarmNamePrefix=rt.config.alarm_prefix) == []
    assert result["status"] == "off"
    assert slack.posts == []
    assert world.status(JOB) == "InProgress"
    assert audits(rt, JOB) == []


def test_duplicated_alarm_events_stop_once_and_post_once(rt, world, slack, context) -> None:
    # Given a hung enforced job that was warned, past its grace period
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(6 * MINUTE)

    # When the same alarm transition of another alarm arrives three times, and a host alarm at the same moment
    event = alarm_event(_alarm(rt, JOB, alarms.GPU_MEMORY, "algo-1"), timestamp="2026-11-30T10:06:00.000+0000")
    results = [on_alarm.handler(event, context) for _ in range(3)]
    results.append(on_alarm.handler(alarm_event(_alarm(rt, JOB, alarms.LOG_IDLE, "algo-2")), context))

    # Then exactly one stop and one stop message happened; the others were coalesced into that decision
    assert [r.get("stopped") for r in results].count(True) == 1
    assert [r["status"] for r in results] == ["decided", "coalesced", "coalesced", "coalesced"]
    assert sum("Stopped stalled job" in text for text in slack.texts()) == 1
    assert len(slack.posts) == 2  # the warning, then the stop
    assert [a["action"] for a in audits(rt, JOB)].count("stop") == 1

    # And once the job's claim has run out, a redelivery of the decided transition is still a duplicate
    rt.clock.advance(decide.COALESCE_SECONDS + 1)
    assert on_alarm.handler(event, context)["status"] == "duplicate"
    assert len(slack.posts) == 2


@pytest.mark.parametrize(
    ("handler", "event", "field"),
    [
        (on_alarm.handler, {"source": "aws.cloudwatch", "alarmData": {"alarmName": ""}}, "alarmArn"),
        (
            on_alarm.handler,
            alarm_event("x") | {"alarmData": {"alarmName": "x", "state": {"value": "ON FIRE"}}},
            "value",
        ),
        (
            on_job_state.handler,
            job_state_event(JOB, "InProgress") | {"detail": {"TrainingJobName": JOB}},
            "TrainingJobStatus",
        ),
        (on_job_state.handler, {"detail-type": "Something Else", "detail": {}}, "detail-type"),
        (on_alarm.handler, "not even a dict", "alarm"),
    ],
)
def test_malformed_events_raise_a_clear_error_and_change_nothing(
    rt, world, slack, context, caplog, handler, event, field
) -> None:
    # Given a hung enforced job that would be acted on
    seed_nccl_hang(world, JOB, ENFORCE)

    # When a malformed event arrives, Then the error names what is wrong
    with pytest.raises(InvalidEventError, match=field):
        handler(event, context)

    # And it was logged, and nothing was stopped, posted, provisioned or recorded
    assert any(r.levelname == "ERROR" and "malformed event" in r.getMessage() for r in caplog.records)
    assert world.status(JOB) == "InProgress"
    assert slack.posts == []
    assert all_alarms(rt.clients.cloudwatch) == []
    assert rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"] == []


def test_slack_down_still_stops_and_records_the_failure(rt, world, slack, context) -> None:
    # Given a hung enforced job that was warned, and Slack answering 500 from then on
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    slack.status = 500
    rt.clock.advance(6 * MINUTE)

    # When the sweeper reaches the stop
    from handlers import sweeper

    (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then the job is stopped anyway, and the audit record says the post failed
    assert (outcome["action"], outcome["stopped"], outcome["posted"]) == ("stop", True, False)
    assert world.status(JOB) == "Stopping"
    stop_audit = next(a for a in audits(rt, JOB) if a["action"] == "stop")
    assert stop_audit["outcome"]["stop"]["ok"] is True
    assert stop_audit["outcome"]["slack"] == {"ok": False, "detail": "webhook HTTP 500: internal_error"}


def _throttle_first(calls: list[str]) -> Any:
    """A before-send hook answering ThrottlingException to the first request only."""

    def hook(request: Any, **kwargs: Any) -> AWSResponse | None:
        calls.append(request.url)
        if len(calls) > 1:
            return None
        body = b'{"__type": "ThrottlingException", "message": "Rate exceeded"}'
        return AWSResponse(request.url, 400, {"x-amzn-errortype": "ThrottlingException"}, MockRawResponse(body))

    return hook


def test_throttled_calls_are_retried(rt, world, slack, context) -> None:
    # Given a hung enforced job past its warning, and SageMaker throttling the first StopTrainingJob request
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(6 * MINUTE)
    stops: list[str] = []
    rt.clients.sagemaker.meta.events.register_first("before-send.sagemaker.StopTrainingJob", _throttle_first(stops))

    # When a new alarm transition arrives
    result = on_alarm.handler(
        alarm_event(_alarm(rt, JOB, alarms.GPU_IDLE, "algo-1"), "2026-11-30T10:06:00.000+0000"), context
    )

    # Then the stop was retried and the job was stopped
    assert len(stops) == 2
    assert (result["action"], result["stopped"]) == ("stop", True)
    assert world.status(JOB) == "Stopping"
    assert rt.states.load(job_key("sagemaker", JOB)).state.stopped_at is not None


def test_two_decisions_from_the_same_read_commit_once(rt) -> None:
    # Given two invocations that read the same job state
    store = rt.states
    key = job_key("sagemaker", JOB)
    read = store.load(key)
    warned = StoredState(JobState(warned_at=rt.clock()), read.version, "incident#1")
    audit = {"diagnosis": "hang", "action": "warn"}

    # When both commit, Then the second loses, whatever event it carries
    store.commit(key, read, warned, audit, rt.clock(), event_key="alarm-a@t1")
    with pytest.raises(ConcurrentDecisionError, match=key):
        store.commit(key, read, warned, audit, rt.clock(), event_key="alarm-b@t1")

    # And a replayed event loses even against a fresh read
    with pytest.raises(ConcurrentDecisionError):
        store.commit(key, store.load(key), warned, audit, rt.clock(), event_key="alarm-a@t1")
    assert store.load(key).version == 1
    assert len(rt.audit.records(key, "audit")) == 1
