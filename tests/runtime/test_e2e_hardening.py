"""End to end on moto, under faults: the alarm lifecycle around a job's end, failed stops, a Lambda that dies in the
middle of a decision, Slack's rate limits, throttling on each API, and oversized events."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from moto.core.botocore_stubber import MockRawResponse
from moto.core.models import botocore_stubber

from handlers import on_alarm, on_job_state, sweeper
from localrun import moto_sagemaker
from localrun.moto_world import MINUTE, alarm_event, all_alarms, job_state_event, scheduled_event
from stallwatch.aws import actions
from stallwatch.aws.events import InvalidEventError
from stallwatch.aws.store import job_key
from stallwatch.core import alarms
from stallwatch.runtime import decide, environment
from stallwatch.runtime.run_goodput import RUN_GOODPUT_ACTION
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, audits, seed_nccl_hang

JOB = "gemma-27b-pretrain"
SERVICES = ("cloudwatch", "logs", "sagemaker", "ec2", "dynamodb", "secretsmanager")
API_BUDGET = 10  # AWS API calls one decision may make, failure paths included


def _alarm_names(rt) -> list[str]:
    return sorted(a["AlarmName"] for a in all_alarms(rt.clients.cloudwatch))


def _state_item(rt, job: str = JOB) -> dict[str, Any] | None:
    key = {"pk": {"S": job_key("sagemaker", job)}, "sk": {"S": "state"}}
    return rt.clients.dynamodb.get_item(TableName=rt.store.table, Key=key).get("Item")


def _count_calls(rt) -> Counter[str]:
    """Every AWS API call the runtime's clients make from now on, by operation (retries not counted)."""
    calls: Counter[str] = Counter()

    def count(model: Any, **kwargs: Any) -> None:
        calls[model.name] += 1

    for service in SERVICES:
        getattr(rt.clients, service).meta.events.register("before-call", count)
    return calls


def _inject(client: Any, operation: str, code: str, times: int = 1) -> None:
    """Answer `code` to the first `times` attempts of `operation`, attempts AWS refused and so never executed: moto's
    stubber, which runs on every attempt whatever answers it, is kept off them."""
    answered = [0]

    def refuse(request: Any, **kwargs: Any) -> AWSResponse | None:
        if answered[0] >= times:
            return None
        answered[0] += 1
        botocore_stubber.enabled = False
        if client.meta.service_model.protocol == "ec2":  # EC2 answers errors in XML
            xml = f"<Response><Errors><Error><Code>{code}</Code><Message>{code} (injected)</Message></Error></Errors>"
            return AWSResponse(request.url, 400, {"Content-Type": "text/xml"}, MockRawResponse(f"{xml}</Response>"))
        body = json.dumps({"__type": code, "message": f"{code} (injected)"}).encode()
        headers = {"x-amzn-errortype": code, "Content-Type": "application/x-amz-json-1.1"}
        return AWSResponse(request.url, 400, headers, MockRawResponse(body))

    def attempt_done(**kwargs: Any) -> None:
        botocore_stubber.enabled = True

    service = client.meta.service_model.service_id.hyphenize()
    client.meta.events.register_first(f"before-send.{service}.{operation}", refuse)
    client.meta.events.register_first(f"needs-retry.{service}.{operation}", attempt_done)


def _warned(rt, world, context) -> None:
    """A hung enforced job, warned, past its stop grace period."""
    seed_nccl_hang(world, JOB, ENFORCE)
    assert on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)["action"] == "warn"
    rt.clock.advance(6 * MINUTE)


def _deny_stops(rt, times: int = 1000) -> None:
    _inject(rt.clients.sagemaker, "StopTrainingJob", "AccessDeniedException", times)


# ---- the alarm lifecycle ---------------------------------------------------------------------------------------


def test_a_late_in_progress_event_after_the_job_failed_creates_no_alarms(rt, world, context) -> None:
    # Given a job that started, got its alarms, and failed (its alarms deleted)
    world.create_job(JOB, hosts=2)
    on_job_state.handler(job_state_event(JOB, "InProgress"), context)
    moto_sagemaker.set_training_job_status(JOB, "Failed", "Failed")
    on_job_state.handler(job_state_event(JOB, "Failed"), context)

    # When a retried InProgress event arrives late
    result = on_job_state.handler(job_state_event(JOB, "InProgress"), context)

    # Then the job is checked first, and no alarm is created
    assert (result["status"], result["reason"]) == ("not_running", "status Failed")
    assert _alarm_names(rt) == []


def test_an_alarm_after_the_job_ended_creates_no_state_and_deletes_its_alarms(rt, world, slack, context) -> None:
    # Given a hung job with alarms that completed, its state cleared by the end event
    seed_nccl_hang(world, JOB, ENFORCE)
    on_job_state.handler(job_state_event(JOB, "InProgress"), context)
    moto_sagemaker.set_training_job_status(JOB, "Completed", "Completed")
    on_job_state.handler(job_state_event(JOB, "Completed"), context)
    alarm = _alarm(rt, JOB)
    rt.clients.cloudwatch.put_metric_alarm(
        **{k: v for k, v in _definition(rt, alarm).items() if k != "AlarmActions"}
    )  # an alarm the end event missed (it was put again by a late retry, say)

    # When that alarm fires after the end
    result = on_alarm.handler(alarm_event(alarm), context)

    # Then nothing is decided or written (the one audit record is the run's goodput, kept at its end), nothing is
    # posted, and the alarm is gone
    assert (result["status"], result["details"]["alarms_deleted"]) == ("ended", 1)
    assert _state_item(rt) is None
    assert [a["action"] for a in audits(rt, JOB)] == [RUN_GOODPUT_ACTION]
    assert slack.posts == []
    assert _alarm_names(rt) == []


def test_an_alarm_after_an_end_event_that_was_lost_retires_the_job(rt, world, slack, context) -> None:
    # Given a hung job with an open incident that failed, its end event lost
    seed_nccl_hang(world, JOB, {"stallwatch:mode": "notify"})
    on_job_state.handler(job_state_event(JOB, "InProgress"), context)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    moto_sagemaker.set_training_job_status(JOB, "Failed", "Failed")
    rt.clock.advance(decide.COALESCE_SECONDS + 1)  # past the first decision's claim

    # When another of its alarms fires
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB, alarms.GPU_IDLE, "algo-1")), context)

    # Then the job is retired as the end event would have: alarms deleted, state cleared, incident closed
    assert (result["status"], result["details"]["alarms_deleted"]) == ("ended", 9)
    assert _state_item(rt) is None
    (incident,) = rt.audit.records(job_key("sagemaker", JOB), "incident")
    assert (incident["status"], incident["close_reason"]) == ("closed", "job Failed")


def _definition(rt, name: str) -> dict[str, Any]:
    """A plausible progress alarm under `name` (the shape `alarms.render_alarms` puts)."""
    return {
        "AlarmName": name,
        "Namespace": "Stallwatch",
        "MetricName": "Steps",
        "Dimensions": [{"Name": "JobName", "Value": JOB}],
        "Statistic": "Sum",
        "Period": 60,
        "EvaluationPeriods": 15,
        "Threshold": 0.0,
        "ComparisonOperator": "LessThanOrEqualToThreshold",
        "AlarmActions": [rt.alarm_action_arn],
    }


def test_an_alarm_for_a_deleted_job_writes_nothing_and_deletes_its_alarms(rt, slack, context) -> None:
    # Given alarms left behind by a job SageMaker no longer knows
    for kind, host in ((alarms.PROGRESS, None), (alarms.GPU_IDLE, "algo-1")):
        rt.clients.cloudwatch.put_metric_alarm(**_definition(rt, _alarm(rt, "gone-job", kind, host)))

    # When one of them fires
    result = on_alarm.handler(alarm_event(_alarm(rt, "gone-job")), context)

    # Then nothing is written or posted, and all its alarms are deleted by the job's prefix
    assert (result["status"], result["details"]["alarms_deleted"]) == ("not_found", 2)
    assert rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"] == []
    assert (slack.posts, _alarm_names(rt)) == ([], [])


def test_the_sweeper_deletes_the_alarms_of_jobs_that_are_not_running(rt, world, context) -> None:
    # Given a running job with alarms, and a job that stopped while its end event was lost (its alarms remain)
    world.create_job(JOB, hosts=1)
    world.create_job("ended-job", hosts=2)
    for job in (JOB, "ended-job"):
        on_job_state.handler(job_state_event(job, "InProgress", hosts=world.jobs.index(job) + 1), context)
    moto_sagemaker.set_training_job_status("ended-job", "Stopped", "Stopped")

    # When the sweeper runs
    summary = sweeper.handler(scheduled_event(), context)

    # Then the ended job's alarms are deleted, and the running job's kept
    assert summary["orphan_alarms_deleted"] == 9
    names = _alarm_names(rt)
    assert names
    assert all(f".{JOB}." in name for name in names)


# ---- failed stops ------------------------------------------------------------------------------------------------


def test_a_stop_that_keeps_failing_is_reported_once_then_once_more_when_it_succeeds(rt, world, slack, context) -> None:
    # Given a warned job whose stops are denied twice (webhook mode: messages cannot be edited)
    _warned(rt, world, context)
    _deny_stops(rt, times=2)

    # When three sweeps try to stop it: two are denied, the third goes through
    outcomes = []
    for _ in range(3):
        (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]
        outcomes.append(outcome)
        rt.clock.advance(5 * MINUTE)

    # Then each sweep tried the stop; the first failure was posted, saying it failed, the second posted nothing
    assert [o["stopped"] for o in outcomes] == [False, False, True]
    assert world.status(JOB) == "Stopping"
    texts = slack.texts()
    assert len(texts) == 3  # the warning, the failed stop, the stop
    assert texts[1].startswith(":x: Stop FAILED for stalled job")
    assert "Stopped" not in texts[1]
    assert texts[2].startswith(":octagonal_sign: Stopped stalled job")
    assert "(attempt 3)" in texts[2]
    # And every attempt is audited
    assert [a["outcome"]["stop"]["ok"] for a in audits(rt, JOB) if a["action"] == "stop"] == [False, False, True]


def test_in_bot_mode_retries_update_the_failed_stop_message(rt, world, slack, context) -> None:
    # Given bot token mode, and a warned job whose stops are denied twice
    rt.clients.secretsmanager.put_secret_value(
        SecretId=rt.notifier.secret_arn, SecretString=json.dumps({"bot_token": "xoxb-1", "channel": "C0ALERTS"})
    )
    rt.notifier.api_url = f"{slack.base}/api/"
    slack.reply = b'{"ok": true, "channel": "C0ALERTS", "ts": "1764496800.000100"}'
    _warned(rt, world, context)
    _deny_stops(rt, times=2)

    # When three sweeps run (two failures, then the stop)
    for _ in range(3):
        sweeper.handler(scheduled_event(), context)
        rt.clock.advance(5 * MINUTE)

    # Then one message was posted for the failed stop, and updated in place by each retry
    assert slack.paths == ["/api/chat.postMessage", "/api/chat.postMessage", "/api/chat.update", "/api/chat.update"]
    assert [p["ts"] for p in slack.posts[2:]] == ["1764496800.000100"] * 2
    assert "(attempt 2)" in slack.posts[2]["text"]
    assert slack.posts[3]["text"].startswith(":octagonal_sign: Stopped stalled job")


def test_a_denied_stop_in_a_cold_container_stays_within_the_api_budget(rt, world, slack, context, monkeypatch) -> None:
    # Given a warned job, and a cold container (fresh clients, no cached secret) whose stop will be denied
    _warned(rt, world, context)
    cold = environment.Runtime.from_env()
    cold.clock = rt.clock
    monkeypatch.setattr(environment, "runtime", lambda: cold)
    _deny_stops(cold)
    calls = _count_calls(cold)

    # When a new alarm transition arrives
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB, alarms.GPU_IDLE, "algo-1"), "2026-11-30T10:06:00Z"), context)

    # Then the stop failed, was recorded and released for the sweeper, within the budget
    assert (result["action"], result["stopped"]) == ("stop", False)
    assert rt.states.load(job_key("sagemaker", JOB)).state.stopped_at is None
    assert sum(calls.values()) <= API_BUDGET, calls


# ---- a Lambda that dies in the middle of a decision ---------------------------------------------------------------


class LambdaTimeout(BaseException):
    """Lambda ending the invocation at its timeout: nothing after this line runs, no handler catches it."""


def test_a_lambda_timeout_after_the_commit_is_completed_by_the_sweeper(rt, world, slack, context, monkeypatch) -> None:
    # Given a warned job, and on_alarm killed right after it committed the stop (before StopTrainingJob)
    _warned(rt, world, context)

    def timed_out(clients: object, facts: object) -> actions.StopResult:
        raise LambdaTimeout

    stop = actions.stop
    monkeypatch.setattr(actions, "stop", timed_out)
    with pytest.raises(LambdaTimeout):
        on_alarm.handler(alarm_event(_alarm(rt, JOB, alarms.GPU_IDLE, "algo-1"), "2026-11-30T10:06:00Z"), context)
    monkeypatch.setattr(actions, "stop", stop)
    assert world.status(JOB) == "InProgress"
    assert rt.states.load(job_key("sagemaker", JOB)).unfinished is not None

    # When the sweeper runs once the dead invocation's timeout has surely passed
    rt.clock.advance(decide.ABANDONED_AFTER_SECONDS + 1)
    (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then it decides again from the state before the unfinished decision: the job is stopped, and it is recorded
    assert (outcome["action"], outcome["stopped"], outcome["posted"]) == ("stop", True, True)
    assert world.status(JOB) == "Stopping"
    assert rt.states.load(job_key("sagemaker", JOB)).unfinished is None
    assert slack.texts()[-1].startswith(":octagonal_sign: Stopped stalled job")


# ---- Slack's rate limit -------------------------------------------------------------------------------------------


def test_slack_429_with_a_short_retry_after_is_retried(rt, world, slack, context) -> None:
    # Given Slack answering the first post 429 "Retry-After: 1"
    seed_nccl_hang(world, JOB, ENFORCE)
    slack.scripted = [(429, {"Retry-After": "1"})]

    # When the warning is posted, Then it is delivered on the retry
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    assert (result["action"], result["posted"]) == ("warn", True)
    assert len(slack.posts) == 2


@pytest.mark.parametrize("retry_after", ["120", "soon"])
def test_slack_429_asking_for_a_long_wait_is_left_to_the_sweeper(rt, world, slack, context, retry_after) -> None:
    # Given Slack answering 429 with a long (or unreadable) Retry-After
    seed_nccl_hang(world, JOB, ENFORCE)
    slack.scripted = [(429, {"Retry-After": retry_after})]

    # When the warning is posted, Then the Lambda does not wait: the post fails and is kept
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    assert (result["action"], result["posted"]) == ("warn", False)
    assert len(slack.posts) == 1
    (pending,) = rt.pending_posts.oldest(limit=10)

    # And the next sweep delivers it
    rt.clock.advance(MINUTE)
    assert [r["status"] for r in sweeper.handler(scheduled_event(), context)["slack_resent"]] == ["delivered"]
    assert slack.posts[-1]["text"] == pending.message["text"]


# ---- throttling on each API ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "operation"),
    [
        ("sagemaker", "DescribeTrainingJob"),
        ("sagemaker", "ListTags"),
        ("cloudwatch", "GetMetricData"),
        ("logs", "DescribeLogStreams"),
        ("logs", "FilterLogEvents"),
        ("dynamodb", "GetItem"),
        ("dynamodb", "TransactWriteItems"),
        ("sagemaker", "StopTrainingJob"),
        ("secretsmanager", "GetSecretValue"),
    ],
)
def test_throttling_on_any_api_of_a_stop_is_retried(rt, world, slack, context, service, operation) -> None:
    # Given a warned job, and `operation` throttled once (a cold secret, so GetSecretValue is called)
    _warned(rt, world, context)
    rt.notifier.secrets.clear_cache()
    code = "ThrottlingException" if service != "dynamodb" else "ProvisionedThroughputExceededException"
    _inject(getattr(rt.clients, service), operation, code)

    # When a new alarm transition arrives
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB, alarms.GPU_IDLE, "algo-1"), "2026-11-30T10:06:00Z"), context)

    # Then the decision went through as if nothing had happened
    assert (result["action"], result["stopped"], result["posted"]) == ("stop", True, True)
    assert world.status(JOB) == "Stopping"


# ---- oversized events ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"state": {"value": "ALARM", "reason": "", "timestamp": "2026-11-30T10:00:00.000+0000" + "9" * 100_000}},
        {"alarmName": f"stallwatch-sagemaker.{JOB}.gpu-idle.{'h' * 5000}"},
    ],
)
def test_an_oversized_alarm_is_refused_before_any_read(rt, world, context, changes) -> None:
    # Given a hung enforced job, and an alarm event with a field far past AWS's limits
    seed_nccl_hang(world, JOB, ENFORCE)
    calls = _count_calls(rt)
    event = alarm_event(_alarm(rt, JOB))
    event["alarmData"] |= changes

    # When it arrives, Then it is an InvalidEventError, and no AWS API was called
    with pytest.raises(InvalidEventError):
        on_alarm.handler(event, context)
    assert sum(calls.values()) == 0
    assert rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"] == []
