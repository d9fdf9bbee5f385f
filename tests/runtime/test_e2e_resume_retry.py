"""End to end on moto: a resume that fails for a reason a later try can fix (capacity, a throttle, a 5xx) is tried
again by the sweeper, as the same attempt, until it starts or an hour has passed; a permanent failure is not retried;
Slack hears the first failure and the end, never once per sweep; a run never gets two jobs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handlers import on_job_state, sweeper
from localrun import moto_sagemaker
from localrun.moto_world import MINUTE, instance_state_event, job_state_event, scheduled_event
from stallwatch.aws.platforms.ec2_goodput import resumes_of
from stallwatch.aws.store import job_key
from stallwatch.core import resume_retry
from tests.runtime.test_e2e_hardening import _inject
from tests.runtime.test_e2e_resume import (
    CHECKPOINT,
    EC2_OPTED_IN,
    JOB,
    RESUME_2,
    _instance,
    _state,
    _stopped_by_stallwatch,
    stop_for_hang,
    training_jobs,
)
from tests.runtime.test_e2e_stalls import seed_nccl_hang

R1 = f"{JOB}-r1"


def _stopped_hang(rt, world, slack, context) -> int:
    """An opted-in run with a checkpoint, hung at step 70 and stopped by Stallwatch; the posts so far."""
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)
    return len(slack.posts)


def _sweep(rt, context, minutes: float = 5) -> list[dict[str, Any]]:
    """The next scheduled sweep (5 minutes on): its resume tries."""
    rt.clock.advance(minutes * MINUTE)
    return sweeper.handler(scheduled_event(), context)["resume_retries"]


def _tries(rt, job: str = JOB) -> list[dict[str, Any]]:
    records = rt.audit.records(job_key("sagemaker", job), "audit")
    return [r for r in records if r["record"]["action"] == "resume"]


def test_a_resume_refused_for_capacity_is_retried_by_the_sweeper_and_resumes_once(rt, world, slack, context) -> None:
    # Given a stopped hang whose CreateTrainingJob SageMaker refuses twice (the instance quota is in use)
    posts = _stopped_hang(rt, world, slack, context)
    moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=2)

    # When the job is Stopped: the first try fails, and Slack hears that it will be retried
    resume = on_job_state.handler(job_state_event(JOB, "Stopped"), context)["resume"]
    assert (resume["status"], resume["tries"], resume["resume"]["code"]) == ("retrying", 1, "ResourceLimitExceeded")
    assert slack.texts()[-1].endswith(
        f"`{JOB}`: resume as `{R1}` failed: ResourceLimitExceeded; retrying every 5 min for up to 1 h"
    )
    assert training_jobs(rt) == [JOB]

    # When the sweeper runs: the second try fails silently, the third starts r1
    (second,) = _sweep(rt, context)
    assert (second["status"], second["tries"]) == ("retrying", 2)
    assert len(slack.posts) == posts + 1
    (third,) = _sweep(rt, context)

    # Then r1 runs, once, as attempt 1 of 2 (a retry is the same attempt), and Slack hears it after 3 tries
    assert (third["status"], third["tries"], third["attempt"]) == ("resumed", 3, 1)
    assert training_jobs(rt) == [JOB, R1]
    assert slack.texts()[-1].endswith(f"`{JOB}` resumed as `{R1}` (attempt 1 of 2) after 3 tries")
    assert len(slack.posts) == posts + 2
    # Every try is audited, with what SageMaker said
    tries = _tries(rt)
    assert [(t["record"].get("try", 1), t["outcome"]["resume"]["ok"]) for t in tries] == [
        (1, False),
        (2, False),
        (3, True),
    ]
    assert "ResourceLimitExceeded" in tries[1]["outcome"]["resume"]["detail"]
    # And nothing is left to try: later sweeps do nothing
    assert _sweep(rt, context) == []
    assert training_jobs(rt) == [JOB, R1]


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("AccessDeniedException", "not retried: access denied (is the training role tagged `stallwatch:resume`?"),
        ("ValidationException", "not retried: the request was refused as invalid"),
    ],
)
def test_a_permanent_failure_is_not_retried_and_slack_hears_why(rt, world, slack, context, code, why) -> None:
    # Given a stopped hang whose CreateTrainingJob is refused for good (the role is not tagged; a bad request)
    posts = _stopped_hang(rt, world, slack, context)
    moto_sagemaker.fail_create_training_job(code, times=1)

    # When the job is Stopped
    resume = on_job_state.handler(job_state_event(JOB, "Stopped"), context)["resume"]

    # Then the resume failed, Slack says why it is not retried, and the sweeper never tries again
    assert (resume["status"], resume["resume"]["transient"]) == ("resume_failed", False)
    assert f"resume as `{R1}` FAILED: CreateTrainingJob {R1}: {code}" in slack.texts()[-1]
    assert why in slack.texts()[-1]
    assert _sweep(rt, context) == []
    assert training_jobs(rt) == [JOB]
    assert len(slack.posts) == posts + 1


def test_retries_that_keep_failing_give_up_after_the_hour_posting_once(rt, world, slack, context) -> None:
    # Given a stopped hang whose CreateTrainingJob keeps being refused for capacity
    posts = _stopped_hang(rt, world, slack, context)
    moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=100)
    assert on_job_state.handler(job_state_event(JOB, "Stopped"), context)["resume"]["status"] == "retrying"

    # When the sweeper runs every 5 minutes for more than an hour
    reports = [report for _ in range(15) for report in _sweep(rt, context)]

    # Then it tried 13 times in all (the first and 12 retries), gave up, and Slack heard the start and the end only
    assert [r["tries"] for r in reports] == list(range(2, resume_retry.MAX_TRIES + 1))
    assert [r["status"] for r in reports] == ["retrying"] * 11 + ["resume_failed"]
    assert len(slack.posts) == posts + 2
    assert f"`{JOB}`: resume as `{R1}` FAILED after 13 tries over 60 min; gave up: " in slack.texts()[-1]
    assert len(_tries(rt)) == resume_retry.MAX_TRIES
    assert training_jobs(rt) == [JOB]


def test_overlapping_sweeps_try_once_and_create_one_job(rt, world, slack, context) -> None:
    # Given a resume that failed once for capacity
    posts = _stopped_hang(rt, world, slack, context)
    moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=1)
    on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    # When a second sweeper run starts while the first is calling CreateTrainingJob
    overlapping: list[dict[str, Any]] = []

    def second_sweep(**kwargs: Any) -> None:
        if not overlapping:
            overlapping.append(sweeper.handler(scheduled_event(), context))

    rt.clients.sagemaker.meta.events.register("before-call.sagemaker.CreateTrainingJob", second_sweep)
    (first,) = _sweep(rt, context)

    # Then the second finds the try taken, and one job was created, one message posted
    assert overlapping[0]["resume_retries"] == [{"job": JOB, "status": "claimed_elsewhere"}]
    assert first["status"] == "resumed"
    assert training_jobs(rt) == [JOB, R1]
    assert len(slack.posts) == posts + 2


def test_a_create_that_went_through_before_its_answer_was_lost_counts_as_resumed(rt, world, slack, context) -> None:
    # Given a stopped hang whose CreateTrainingJob creates r1 but answers with an error (its answer was lost)
    _stopped_hang(rt, world, slack, context)
    moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=1, after_create=True)
    assert on_job_state.handler(job_state_event(JOB, "Stopped"), context)["resume"]["status"] == "retrying"

    # When the sweeper tries again, and SageMaker answers that r1 exists
    (retry,) = _sweep(rt, context)

    # Then r1 is recognised as this resume's own job (its chain tags): resumed, not failed, and no second job
    assert (retry["status"], retry["tries"]) == ("resumed", 2)
    assert "created by an earlier try (ResourceInUse)" in retry["resume"]["detail"]
    assert training_jobs(rt) == [JOB, R1]
    assert slack.texts()[-1].endswith(f"resumed as `{R1}` (attempt 1 of 2) after 2 tries")


def test_a_5xx_after_create_retried_by_botocore_within_the_call_counts_as_resumed(rt, world, slack, context) -> None:
    # Given a CreateTrainingJob that SageMaker takes but answers with a 500; botocore retries and hears ResourceInUse
    _stopped_hang(rt, world, slack, context)
    moto_sagemaker.fail_create_training_job("InternalFailure", status=500, after_create=True)

    resume = on_job_state.handler(job_state_event(JOB, "Stopped"), context)["resume"]

    assert (resume["status"], resume["tries"]) == ("resumed", 1)
    assert training_jobs(rt) == [JOB, R1]
    assert slack.texts()[-1].endswith(f"`{JOB}` resumed as `{R1}` (attempt 1 of 2)")


def test_a_job_of_that_name_not_created_by_the_resume_is_not_taken_for_it(rt, world, slack, context) -> None:
    # Given someone created <run>-r1 by hand before Stallwatch resumed the run
    _stopped_hang(rt, world, slack, context)
    world.create_job(R1, hosts=1)

    resume = on_job_state.handler(job_state_event(JOB, "Stopped"), context)["resume"]

    assert (resume["status"], resume["resume"]["code"]) == ("resume_failed", "ResourceInUse")
    assert "not retried: a job of that name exists that this resume did not create" in slack.texts()[-1]


def test_an_ec2_start_refused_for_capacity_is_retried_by_the_sweeper(rt, slack, context) -> None:
    # Given a tagged GPU instance that Stallwatch stopped for a hang, and EC2 short of capacity once
    instance = _instance(rt, EC2_OPTED_IN)
    _stopped_by_stallwatch(rt, instance, rt.clock(), step=100.0)
    _inject(rt.clients.ec2, "StartInstances", "InsufficientInstanceCapacity")

    # When EC2 reports it stopped: StartInstances fails, and Slack hears it will be retried
    first = on_job_state.handler(instance_state_event(instance, "stopped"), context)["resume"]
    assert (first["status"], first["resume"]["code"]) == ("retrying", "InsufficientInstanceCapacity")
    assert _state(rt, instance) == "stopped"
    assert "failed: InsufficientInstanceCapacity; retrying every 5 min" in slack.texts()[-1]

    # When the sweeper runs, Then the instance is started, as attempt 1 of 1, and the budget is not spent twice
    (retry,) = _sweep(rt, context)
    assert (retry["status"], retry["tries"], retry["attempt"]) == ("resumed", 2, 1)
    assert _state(rt, instance) in ("pending", "running")
    assert slack.texts()[-1].endswith(f"`{instance}` resumed as `{instance}` (attempt 1 of 1) after 2 tries")
    assert rt.resume_tries.claims(job_key("ec2", instance)) == 1
    # And the goodput report sees one resume, the try that started the group, with the stopped attempt's launch
    (resumed,) = resumes_of(rt.audit.records(job_key("ec2", instance), "audit"))
    assert resumed.at == rt.clock()
    assert resumed.launched is not None


def test_in_bot_mode_later_tries_update_the_retrying_message_in_place(rt, world, slack, context) -> None:
    # Given Slack in bot mode, and a stopped hang whose CreateTrainingJob is refused three times for capacity
    rt.clients.secretsmanager.put_secret_value(
        SecretId=rt.notifier.secret_arn, SecretString=json.dumps({"bot_token": "xoxb-1", "channel": "C0ALERTS"})
    )
    rt.notifier.api_url = f"{slack.base}/api/"
    slack.reply = b'{"ok": true, "channel": "C0ALERTS", "ts": "1764496800.000100"}'
    posts = _stopped_hang(rt, world, slack, context)
    moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=3)
    slack.reply = b'{"ok": true, "channel": "C0ALERTS", "ts": "1764496800.000200"}'  # the next message's ts

    # When the job is Stopped and the sweeper tries three more times
    on_job_state.handler(job_state_event(JOB, "Stopped"), context)
    reports = [report for _ in range(3) for report in _sweep(rt, context)]

    # Then the retrying message went in the stop's thread, the two failed retries updated it, and the success is a
    # new reply in the thread
    assert [r["status"] for r in reports] == ["retrying", "retrying", "resumed"]
    assert slack.paths[posts:] == [
        "/api/chat.postMessage",
        "/api/chat.update",
        "/api/chat.update",
        "/api/chat.postMessage",
    ]
    retrying, first_update, second_update, resumed = slack.posts[posts:]
    assert retrying["thread_ts"] == resumed["thread_ts"] == "1764496800.000100"
    assert (first_update["ts"], first_update["channel"]) == ("1764496800.000200", "C0ALERTS")
    assert second_update["text"].endswith("retrying every 5 min for up to 1 h (try 3 of 13 failed)")
    assert resumed["text"].endswith(f"resumed as `{R1}` (attempt 1 of 2) after 4 tries")
