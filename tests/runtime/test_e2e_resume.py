"""End to end on moto: a run Stallwatch stopped for a hang resumes from its checkpoint as <run>-r<N>, once per stop,
within its restart budget, and only while it makes progress; Slack hears each step."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from handlers import on_alarm, on_job_state, sweeper
from localrun import moto_sagemaker
from localrun.moto_world import (
    MINUTE,
    World,
    alarm_event,
    instance_state_event,
    job_state_event,
    scheduled_event,
)
from stallwatch.aws.store import job_key
from stallwatch.runtime import environment
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, seed_hang_signals, seed_nccl_hang

JOB = "llama-8b-pretrain"
CHECKPOINT = "s3://bucket/checkpoints/llama-8b"
RESUME_2 = ENFORCE | {"stallwatch:resume": "2"}


pytestmark = pytest.mark.slow


def stop_for_hang(rt, job: str, context) -> None:
    """The hang's alarm fires, the warning's grace passes, the sweeper stops the job; SageMaker reports Stopped."""
    on_alarm.handler(alarm_event(_alarm(rt, job), timestamp=f"2026-11-30T10:{len(job) % 60:02d}:00.000+0000"), context)
    rt.clock.advance(6 * MINUTE)
    (outcome,) = [o for o in sweeper.handler(scheduled_event(), context)["redecided"] if o["job"] == job]
    assert (outcome["action"], outcome["stopped"]) == ("stop", True)
    world = World(rt.clients, rt.clock())
    world.status(job)  # Stopping is reported once; then SageMaker has released the instances
    assert world.status(job) == "Stopped"


def training_jobs(rt) -> list[str]:
    return sorted(j["TrainingJobName"] for j in rt.clients.sagemaker.list_training_jobs()["TrainingJobSummaries"])


def resumed_world(rt, job: str) -> World:
    """The resumed job is training (for two hours, so the engine judges it past its startup)."""
    world = World(rt.clients, now=rt.clock())
    moto_sagemaker.set_training_job_status(job, "InProgress", "Training", at=rt.clock() - 120 * MINUTE)
    return world


def test_a_hang_stop_resumes_as_r1_cloned_with_its_checkpoint_and_slack_hears_it(rt, world, slack, context) -> None:
    # Given a run that opted in to two restarts, with a CheckpointConfig, hung at step 70 and stopped by Stallwatch
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)

    # When SageMaker reports it Stopped
    result = on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    # Then the alarms are gone and the run resumed as <job>-r1, a copy of the stopped job
    assert result["status"] == "retired"
    resume = result["resume"]
    assert (resume["status"], resume["resumed_as"], resume["attempt"], resume["posted"]) == (
        "resumed",
        f"{JOB}-r1",
        1,
        True,
    )
    sagemaker = rt.clients.sagemaker
    old = sagemaker.describe_training_job(TrainingJobName=JOB)
    new = sagemaker.describe_training_job(TrainingJobName=f"{JOB}-r1")
    for key in ("RoleArn", "CheckpointConfig", "Environment", "HyperParameters", "ResourceConfig", "OutputDataConfig"):
        assert new[key] == old[key], key
    assert new["AlgorithmSpecification"]["TrainingImage"] == old["AlgorithmSpecification"]["TrainingImage"]
    used = old["TrainingTimeInSeconds"]
    assert used > 0
    assert new["StoppingCondition"]["MaxRuntimeInSeconds"] == 86400 - used
    tags = {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=new["TrainingJobArn"])["Tags"]}
    assert tags == RESUME_2 | {
        "stallwatch:run": JOB,
        "stallwatch:resumed-from": JOB,
        "stallwatch:resume-attempt": "1",
        "stallwatch:resume-best-step": "70",
    }
    assert slack.texts()[-1].endswith(f"`{JOB}` resumed as `{JOB}-r1` (attempt 1 of 2)")
    (audit,) = [r for r in rt.audit.records(job_key("sagemaker", JOB), "audit") if r["record"]["action"] == "resume"]
    assert audit["outcome"]["resume"]["ok"] is True

    # When the resumed job trains past step 70 from its checkpoint (step 60) and the sweeper runs
    world = resumed_world(rt, f"{JOB}-r1")
    restarted = rt.clock()
    world.agent_job(f"{JOB}-r1", "Step", [(restarted + 60 * k, 60.0 + 5 * k) for k in range(1, 6)])
    rt.clock.advance(6 * MINUTE)
    summary = sweeper.handler(scheduled_event(), context)

    # Then Slack hears, once, when the run passed its old best step
    (progress,) = summary["resumed_progress"]
    assert (progress["status"], progress["step"]) == ("progressed", 75.0)
    assert slack.texts()[-1].endswith(f"`{JOB}-r1`: step 75 reached 3 min after the restart")
    posts = len(slack.posts)
    assert sweeper.handler(scheduled_event(), context)["resumed_progress"] == []
    assert len(slack.posts) == posts


def test_a_duplicated_stopped_event_resumes_once(rt, world, slack, context) -> None:
    # Given a hung run stopped by Stallwatch
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)

    # When EventBridge delivers the Stopped event twice
    first = on_job_state.handler(job_state_event(JOB, "Stopped"), context)
    posts = len(slack.posts)
    second = on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    # Then one job was created and one message posted
    assert (first["resume"]["status"], second["resume"]["status"]) == ("resumed", "duplicate")
    assert training_jobs(rt) == [JOB, f"{JOB}-r1"]
    assert len(slack.posts) == posts


def test_without_a_checkpoint_slack_hears_cannot_resume_and_nothing_starts(rt, world, slack, context) -> None:
    seed_nccl_hang(world, JOB, RESUME_2)  # no CheckpointConfig, no stallwatch:checkpoint tag
    stop_for_hang(rt, JOB, context)

    result = on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    assert result["resume"]["status"] == "gave_up"
    assert training_jobs(rt) == [JOB]
    assert "cannot resume: no checkpoint" in slack.texts()[-1]


def test_a_checkpoint_tag_stands_in_for_a_checkpoint_config(rt, world, slack, context) -> None:
    seed_nccl_hang(world, JOB, RESUME_2 | {"stallwatch:checkpoint": "s3://bucket/runs/llama/ckpt/"})
    stop_for_hang(rt, JOB, context)

    result = on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    assert result["resume"]["status"] == "resumed"
    assert training_jobs(rt) == [JOB, f"{JOB}-r1"]


def test_no_resume_after_an_idle_stop(rt, world, slack, context) -> None:
    # Given an opted-in run whose GPUs went idle (the work is done), stopped by Stallwatch
    world.create_job(JOB, hosts=1, tags=RESUME_2, checkpoint=CHECKPOINT)
    world.steps_until(JOB, last_step_min=40)
    world.host_gpu(JOB, "algo-1", world.every_minute(110, lambda m: 95.0 if m > 40 else 0.0))
    world.progress_logs(JOB, "algo-1", until_min=40)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(6 * MINUTE)
    (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]
    assert (outcome["diagnosis"], outcome["action"]) == ("idle", "stop")
    posts = len(slack.posts)

    # When it is Stopped
    result = on_job_state.handler(job_state_event(JOB, "Stopped", hosts=1), context)

    # Then nothing restarts and Slack hears nothing more
    assert result["resume"]["status"] == "not_resumed"
    assert "idle" in result["resume"]["reason"]
    assert training_jobs(rt) == [JOB]
    assert len(slack.posts) == posts


def test_no_resume_after_a_humans_stop(rt, world, slack, context) -> None:
    # Given an opted-in, hung run that a human stops before Stallwatch does
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    rt.clients.sagemaker.stop_training_job(TrainingJobName=JOB)
    world.status(JOB)

    result = on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    assert result["resume"]["status"] == "not_resumed"
    assert "not stopped by Stallwatch" in result["resume"]["reason"]
    assert training_jobs(rt) == [JOB]
    assert slack.posts == []


def _resume_and_hang_again(rt, slack, context, job: str, start_min: float) -> dict:
    """The resumed `job` trains, hangs (its last step `start_min - 40`), is stopped and reported Stopped."""
    world = resumed_world(rt, job)
    seed_hang_signals(world, job, start_min=start_min)
    on_job_state.handler(job_state_event(job, "InProgress"), context)
    stop_for_hang(rt, job, context)
    return on_job_state.handler(job_state_event(job, "Stopped"), context)["resume"]


def test_the_restart_budget_ends_the_chain(rt, world, slack, context) -> None:
    # Given a run allowed one restart, which hangs at step 70, resumes, then hangs again further on (step 110)
    seed_nccl_hang(world, JOB, ENFORCE | {"stallwatch:resume": "1"}, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)
    assert on_job_state.handler(job_state_event(JOB, "Stopped"), context)["resume"]["status"] == "resumed"

    result = _resume_and_hang_again(rt, slack, context, f"{JOB}-r1", start_min=150)

    # Then it is not resumed a second time, and Slack hears that the budget is spent
    assert result["status"] == "gave_up"
    assert training_jobs(rt) == [JOB, f"{JOB}-r1"]
    assert "gave up: restart budget spent (1 of 1 restarts)" in slack.texts()[-1]


def test_a_restart_without_progress_gives_up(rt, world, slack, context) -> None:
    # Given a run allowed two restarts, hung at step 70, resumed, and hung again before passing step 70 (step 60)
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)
    on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    result = _resume_and_hang_again(rt, slack, context, f"{JOB}-r1", start_min=100)

    # Then the chain ends there: no r2, and Slack says why
    assert result["status"] == "gave_up"
    assert training_jobs(rt) == [JOB, f"{JOB}-r1"]
    assert slack.texts()[-1].endswith(f"`{JOB}-r1`: gave up: no progress after 1 restart")


def test_progress_makes_a_second_restart_r2(rt, world, slack, context) -> None:
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)
    on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    result = _resume_and_hang_again(rt, slack, context, f"{JOB}-r1", start_min=150)

    assert (result["status"], result["resumed_as"], result["attempt"]) == ("resumed", f"{JOB}-r2", 2)
    assert slack.texts()[-1].endswith(f"`{JOB}-r1` resumed as `{JOB}-r2` (attempt 2 of 2)")


def test_a_run_that_opted_in_gets_its_goodput_on_slack_when_it_ends_once(rt, world, slack, context) -> None:
    # Given a run that asked for its summary, hung and was stopped without a resume (no checkpoint)
    tags = ENFORCE | {"stallwatch:summary": "true"}
    seed_nccl_hang(world, JOB, tags)
    stop_for_hang(rt, JOB, context)

    # When it is Stopped (twice: a duplicated event)
    result = on_job_state.handler(job_state_event(JOB, "Stopped", tags=tags), context)
    again = on_job_state.handler(job_state_event(JOB, "Stopped", tags=tags), context)

    # Then Slack gets the run's summary once, with the stall it caught
    assert (result["summary"]["status"], again["summary"]["status"]) == ("posted", "duplicate")
    (summary,) = [p for p in slack.posts if p["text"].startswith(":bar_chart: Run summary")]
    assert summary["text"].startswith(f":bar_chart: Run summary: {JOB}: goodput ")
    assert "1 stalls caught" in str(summary["blocks"])
    assert "stalls: " in str(summary["blocks"])


def test_the_summary_links_the_job_dashboard_the_stack_names(rt, world, slack, context, monkeypatch) -> None:
    # Given the functions' environment naming the job dashboard (as the stack sets it), and a run that asked for its
    # summary, hung and was stopped
    url = (
        "https://console.aws.amazon.com/cloudwatch/home?region=us-east-1#dashboards/dashboard/stallwatch-job-us-east-1"
    )
    monkeypatch.setenv("JOB_DASHBOARD_URL", url)
    rt.job_dashboard_url = environment.Runtime.from_env().job_dashboard_url
    tags = ENFORCE | {"stallwatch:summary": "true"}
    seed_nccl_hang(world, JOB, tags)
    stop_for_hang(rt, JOB, context)

    # When it ends
    on_job_state.handler(job_state_event(JOB, "Stopped", tags=tags), context)

    # Then the summary's last line links that dashboard (the run picked in its Job list) and the report's chart
    (summary,) = [p for p in slack.posts if p["text"].startswith(":bar_chart: Run summary")]
    (line,) = summary["blocks"][-1]["elements"]
    assert f"<{url}|CloudWatch dashboard> (pick `{JOB}` in Job)" in line["text"]
    assert f"`stallwatch report {JOB} --plot {JOB}.png`" in line["text"]


def test_no_summary_unless_asked(rt, world, slack, context) -> None:
    world.create_job(JOB, hosts=1, tags=ENFORCE)
    result = on_job_state.handler(job_state_event(JOB, "Completed", hosts=1, tags=ENFORCE), context)
    assert result["summary"] == {"status": "off"}
    assert slack.posts == []


EC2_OPTED_IN = {
    "stallwatch:monitor": "true",
    "stallwatch:mode": "enforce",
    "stallwatch:resume": "1",
    "stallwatch:checkpoint": "s3://bucket/runs/gpt/ckpt/",
}


def _instance(rt, tags: dict[str, str]) -> str:
    return rt.clients.ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="p4d.24xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )["Instances"][0]["InstanceId"]


def _stopped_by_stallwatch(rt, instance: str, at: float, step: float) -> None:
    """The engine's stop of a hung EC2 job (its audit record as decide_and_act commits it), then the stop itself."""
    key = job_key("ec2", instance)
    read = rt.states.load(key)
    record = {"at": at, "job": instance, "action": "stop", "diagnosis": "hang", "evidence": {"agent": {"step": step}}}
    rt.states.commit(key, read, replace(read, state=read.state.with_(stopped_at=at)), record, at)
    rt.clients.ec2.stop_instances(InstanceIds=[instance])


def _state(rt, instance: str) -> str:
    reservations = rt.clients.ec2.describe_instances(InstanceIds=[instance])["Reservations"]
    return reservations[0]["Instances"][0]["State"]["Name"]


def test_an_ec2_job_is_resumed_by_starting_its_instances_within_its_budget(rt, slack, context) -> None:
    # Given a tagged GPU instance that Stallwatch stopped for a hang at step 100
    instance = _instance(rt, EC2_OPTED_IN)
    _stopped_by_stallwatch(rt, instance, rt.clock(), step=100.0)

    # When EC2 reports it stopped (twice)
    first = on_job_state.handler(instance_state_event(instance, "stopped"), context)["resume"]
    second = on_job_state.handler(instance_state_event(instance, "stopped"), context)["resume"]

    # Then its instances are started again, once, and Slack hears it
    assert (first["status"], first["attempt"], second["status"]) == ("resumed", 1, "duplicate")
    assert _state(rt, instance) in ("pending", "running")
    assert slack.texts()[-1].endswith(f"`{instance}` resumed as `{instance}` (attempt 1 of 1)")

    # When it hangs again further on and is stopped: the budget of one restart is spent
    rt.clock.advance(3600)
    _stopped_by_stallwatch(rt, instance, rt.clock(), step=300.0)
    again = on_job_state.handler(instance_state_event(instance, "stopped"), context)["resume"]
    assert again["status"] == "gave_up"
    assert _state(rt, instance) == "stopped"
    assert "restart budget spent (1 of 1 restarts)" in slack.texts()[-1]


def test_an_ec2_job_without_a_checkpoint_tag_is_not_started(rt, slack, context) -> None:
    tags = {k: v for k, v in EC2_OPTED_IN.items() if k != "stallwatch:checkpoint"}
    instance = _instance(rt, tags)
    _stopped_by_stallwatch(rt, instance, rt.clock(), step=100.0)

    result = on_job_state.handler(instance_state_event(instance, "stopped"), context)["resume"]

    assert result["status"] == "gave_up"
    assert _state(rt, instance) == "stopped"
    assert "cannot resume: no checkpoint" in slack.texts()[-1]


def test_a_resumed_job_without_steps_yet_stays_watched_and_one_that_ends_first_is_dropped(
    rt, world, slack, context
) -> None:
    # Given a run resumed as r1, still starting (no step yet)
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)
    on_job_state.handler(job_state_event(JOB, "Stopped"), context)
    posts = len(slack.posts)

    # When the sweeper runs, Then nothing is said and the watch stays
    assert sweeper.handler(scheduled_event(), context)["resumed_progress"] == []
    assert len(rt.progress_watches.oldest(10)) == 1

    # When r1 fails before passing step 70, Then the watch is dropped without a message
    moto_sagemaker.set_training_job_status(f"{JOB}-r1", "Failed", "Failed")
    (report,) = sweeper.handler(scheduled_event(), context)["resumed_progress"]
    assert report == {"job": f"{JOB}-r1", "status": "ended"}
    assert rt.progress_watches.oldest(10) == []
    assert len(slack.posts) == posts


def test_in_bot_mode_the_resume_message_goes_in_the_stop_messages_thread(rt, world, slack, context) -> None:
    # Given Slack in bot mode (a bot token and a channel), answering each post with its timestamp
    secret = rt.notifier.secret_arn
    rt.clients.secretsmanager.put_secret_value(
        SecretId=secret, SecretString=json.dumps({"bot_token": "xoxb-1", "channel": "C0ALERTS"})
    )
    rt.notifier.api_url = f"{slack.base}/api/"
    slack.reply = b'{"ok": true, "ts": "1764496800.000100"}'
    seed_nccl_hang(world, JOB, RESUME_2, checkpoint=CHECKPOINT)
    stop_for_hang(rt, JOB, context)

    # When the stopped job is resumed
    on_job_state.handler(job_state_event(JOB, "Stopped"), context)

    # Then the stop message went to the channel, and the resume message is a reply in its thread
    stop_message, resumed = slack.posts[-2], slack.posts[-1]
    assert "Stopped stalled job" in stop_message["text"]
    assert "thread_ts" not in stop_message
    assert resumed["thread_ts"] == "1764496800.000100"
    assert resumed["text"].endswith(f"resumed as `{JOB}-r1` (attempt 1 of 2)")
