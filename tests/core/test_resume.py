"""Resume planning: who is resumed, as what, within which budget; pure, from DescribeTrainingJob-shaped input."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from stallwatch.core import resume
from stallwatch.core.resume import NoResume, ResumePlan, StopRecord

T0 = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
HANG_STOP = StopRecord(at=1_000.0, diagnosis="hang", step=1200.0, stall_onset=900.0, ok=True, slack_ts="1.2")


def described(name: str = "llama-70b", checkpoint: bool = True, **extra: object) -> dict:
    """A DescribeTrainingJob answer, as SageMaker returns it for a stopped job."""
    job = {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
        "TrainingJobStatus": "Stopped",
        "AlgorithmSpecification": {
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311",
            "TrainingInputMode": "FastFile",
            "MetricDefinitions": [{"Name": "loss", "Regex": "loss=(\\S+)"}],
            "EnableSageMakerMetricsTimeSeries": False,
        },
        "RoleArn": "arn:aws:iam::123456789012:role/training",
        "HyperParameters": {"lr": "3e-4", "sagemaker_program": "train.py"},
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://d/train"}},
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
        "ResourceConfig": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 8, "VolumeSizeInGB": 500},
        "VpcConfig": {"SecurityGroupIds": ["sg-0123"], "Subnets": ["subnet-0123"]},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86_400},
        "Environment": {"NCCL_DEBUG": "WARN"},
        "EnableNetworkIsolation": False,
        "DebugRuleConfigurations": [{"RuleConfigurationName": "LossNotDecreasing", "RuleEvaluatorImage": "img"}],
        "CreationTime": T0,
        "TrainingStartTime": T0,
        "TrainingEndTime": datetime(2026, 1, 1, 10, 0, tzinfo=UTC),
        "TrainingTimeInSeconds": 36_000,
        "SecondaryStatus": "Stopped",
    }
    if checkpoint:
        job["CheckpointConfig"] = {"S3Uri": "s3://bucket/ckpt/llama-70b", "LocalPath": "/opt/ml/checkpoints"}
    return job | extra


OPTED_IN = {"stallwatch:resume": "3", "stallwatch:mode": "enforce", "team": "nlp", "aws:cloudformation:stack": "x"}


def test_a_hung_job_with_a_checkpoint_is_cloned_as_r1_with_the_runtime_it_has_left() -> None:
    # Given a job that opted in to 3 restarts, with a CheckpointConfig, stopped by Stallwatch for a hang
    plan = resume.plan_resume(described(), OPTED_IN, HANG_STOP, default_max_restarts=0)

    # Then its first restart is planned: same image, role, data, VPC, environment, checkpoint and hosts
    assert isinstance(plan, ResumePlan)
    assert (plan.name, plan.attempt, plan.max_restarts, plan.best_step) == ("llama-70b-r1", 1, 3, 1200.0)
    request = plan.request
    source = described()
    for key in ("RoleArn", "HyperParameters", "InputDataConfig", "VpcConfig", "Environment", "CheckpointConfig"):
        assert request[key] == source[key]
    assert request["ResourceConfig"] == source["ResourceConfig"]
    assert request["AlgorithmSpecification"] == source["AlgorithmSpecification"]
    # ...with MaxRuntime less the 10 h already used, and the chain in its tags (AWS's own tags left out)
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 86_400 - 36_000}
    tags = {t["Key"]: t["Value"] for t in request["Tags"]}
    assert tags == {
        "stallwatch:resume": "3",
        "stallwatch:mode": "enforce",
        "team": "nlp",
        "stallwatch:run": "llama-70b",
        "stallwatch:resumed-from": "llama-70b",
        "stallwatch:resume-attempt": "1",
        "stallwatch:resume-best-step": "1200",
    }
    for key in ("TrainingJobArn", "TrainingJobStatus", "CreationTime", "TrainingTimeInSeconds", "SecondaryStatus"):
        assert key not in request


def test_the_second_restart_is_named_after_the_run_and_keeps_the_best_step() -> None:
    # Given the first restart, stopped again after passing the run's best step
    tags = OPTED_IN | {
        "stallwatch:run": "llama-70b",
        "stallwatch:resumed-from": "llama-70b",
        "stallwatch:resume-attempt": "1",
        "stallwatch:resume-best-step": "1200",
    }
    stop = StopRecord(at=2_000.0, diagnosis="crashed_rank", step=1500.0, stall_onset=1900.0, ok=True)
    plan = resume.plan_resume(described("llama-70b-r1"), tags, stop, default_max_restarts=0)

    # Then it becomes llama-70b-r2, resumed from r1
    assert isinstance(plan, ResumePlan)
    assert (plan.name, plan.attempt, plan.best_step) == ("llama-70b-r2", 2, 1500.0)
    tags_out = {t["Key"]: t["Value"] for t in plan.request["Tags"]}
    assert tags_out["stallwatch:resumed-from"] == "llama-70b-r1"
    assert tags_out["stallwatch:run"] == "llama-70b"


@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        (None, "not stopped by Stallwatch"),
        (StopRecord(at=1.0, diagnosis="idle", step=10.0, stall_onset=0.0, ok=True), "stopped for idle"),
        (StopRecord(at=1.0, diagnosis="phase_overrun", step=10.0, stall_onset=0.0, ok=True), "phase_overrun"),
        (StopRecord(at=1.0, diagnosis="hang", step=10.0, stall_onset=0.0, ok=False), "stop failed"),
    ],
)
def test_no_resume_after_a_human_stop_idle_or_a_failed_stop_and_no_alert(stop: StopRecord | None, reason: str) -> None:
    verdict = resume.plan_resume(described(), OPTED_IN, stop, default_max_restarts=3)
    assert isinstance(verdict, NoResume)
    assert reason in verdict.reason
    assert not verdict.alert


def test_resume_is_off_unless_the_tag_or_the_policy_opts_in() -> None:
    untagged = {"stallwatch:mode": "enforce"}
    off = resume.plan_resume(described(), untagged, HANG_STOP, default_max_restarts=0)
    assert isinstance(off, NoResume)
    assert not off.alert
    by_policy = resume.plan_resume(described(), untagged, HANG_STOP, default_max_restarts=2)
    assert isinstance(by_policy, ResumePlan)
    assert by_policy.max_restarts == 2
    tag_off = resume.plan_resume(described(), {"stallwatch:resume": "off"}, HANG_STOP, default_max_restarts=2)
    assert isinstance(tag_off, NoResume)


def test_without_a_checkpoint_it_alerts_cannot_resume_unless_a_tag_names_the_prefix() -> None:
    verdict = resume.plan_resume(described(checkpoint=False), OPTED_IN, HANG_STOP, default_max_restarts=0)
    assert isinstance(verdict, NoResume)
    assert verdict.alert
    assert verdict.reason.startswith("cannot resume: no checkpoint")
    tagged = OPTED_IN | {"stallwatch:checkpoint": "s3://bucket/runs/llama/ckpt/"}
    assert isinstance(resume.plan_resume(described(checkpoint=False), tagged, HANG_STOP, 0), ResumePlan)


def test_the_restart_budget_and_no_progress_give_up_with_an_alert() -> None:
    spent = OPTED_IN | {"stallwatch:resume-attempt": "3", "stallwatch:resume-best-step": "1000"}
    verdict = resume.plan_resume(described("llama-70b-r3"), spent, HANG_STOP, 0)
    assert isinstance(verdict, NoResume)
    assert verdict.alert
    assert verdict.reason == "gave up: restart budget spent (3 of 3 restarts)"

    stuck = OPTED_IN | {"stallwatch:resume-attempt": "2", "stallwatch:resume-best-step": "1200"}
    verdict = resume.plan_resume(described("llama-70b-r2"), stuck, HANG_STOP, 0)  # stopped at step 1200 again
    assert isinstance(verdict, NoResume)
    assert verdict.alert
    assert verdict.reason == "gave up: no progress after 2 restarts"


def test_a_bad_resume_tag_alerts_and_a_used_up_runtime_gives_up() -> None:
    bad = resume.plan_resume(described(), {"stallwatch:resume": "many"}, HANG_STOP, 0)
    assert isinstance(bad, NoResume)
    assert bad.alert
    assert "stallwatch:resume='many'" in bad.reason
    used = resume.plan_resume(described(TrainingTimeInSeconds=86_400), OPTED_IN, HANG_STOP, 0)
    assert isinstance(used, NoResume)
    assert "MaxRuntimeInSeconds" in used.reason


SAGEMAKER_JOB_NAME = re.compile(r"(?=.{1,63}\Z)[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")  # CreateTrainingJob's TrainingJobName


def test_names_fit_63_characters_and_an_algorithm_resource_keeps_no_image() -> None:
    long = "a" * 60 + "-bc"
    name = resume.resume_name(long, 10)
    assert len(name) <= 63
    assert name.endswith("-r10")
    assert resume.resume_name("llama-70b", 2) == "llama-70b-r2"  # a name that fits is not cut
    algorithm = described(
        AlgorithmSpecification={"AlgorithmName": "arn:algo", "TrainingImage": "x", "TrainingInputMode": "File"}
    )
    plan = resume.plan_resume(algorithm, OPTED_IN, HANG_STOP, 0)
    assert isinstance(plan, ResumePlan)
    assert plan.request["AlgorithmSpecification"] == {"AlgorithmName": "arn:algo", "TrainingInputMode": "File"}


@pytest.mark.parametrize("attempt", [1, 9, 10])
def test_two_runs_sharing_their_first_60_characters_get_resume_names_of_their_own(attempt: int) -> None:
    # Given two SDK-style 63-character names that differ only in their millisecond timestamp
    first = "pytorch-training-llama-70b-pretrain-long-exp-2026-11-30-10-00-00-123"[:63]
    second = first[:-3] + "456"
    assert len(first) == len(second) == 63
    assert first[:60] == second[:60]

    # When each is resumed
    names = [resume.resume_name(run, attempt) for run in (first, second)]

    # Then the names differ, are valid SageMaker names and say the attempt
    assert names[0] != names[1]
    assert all(len(n) <= 63 and SAGEMAKER_JOB_NAME.fullmatch(n) and n.endswith(f"-r{attempt}") for n in names)
    assert resume.resume_name(first, attempt) == names[0]  # the same run, the same name: a retry finds its job


def test_a_job_with_48_user_tags_is_resumed_with_50_stallwatchs_own_kept_and_the_rest_named() -> None:
    # Given a job with 48 user tags and 2 of Stallwatch's (mode, resume), resumed for the first time (4 chain tags)
    tags = {f"team-tag-{i:02d}": "x" for i in range(48)} | {"stallwatch:resume": "3", "stallwatch:mode": "enforce"}

    # When it is planned
    plan = resume.plan_resume(described(), tags, HANG_STOP, default_max_restarts=0)

    # Then the request carries AWS's 50 at most: every stallwatch:* tag, and the first 44 user tags
    assert isinstance(plan, ResumePlan)
    sent = {t["Key"]: t["Value"] for t in plan.request["Tags"]}
    assert len(sent) == resume.MAX_TAGS
    assert {k for k in sent if k.startswith("stallwatch:")} == {
        "stallwatch:resume",
        "stallwatch:mode",
        *resume.CHAIN_TAGS,
    }
    assert plan.dropped_tags == tuple(f"team-tag-{i:02d}" for i in range(44, 48))
    # And Slack is told which
    text = resume.resumed_text("llama-70b", plan)
    assert "tags left off" in text
    assert "`team-tag-47`" in text


def test_a_job_within_the_tag_limit_keeps_every_tag_and_slack_hears_of_none() -> None:
    plan = resume.plan_resume(described(), OPTED_IN, HANG_STOP, default_max_restarts=0)
    assert isinstance(plan, ResumePlan)
    assert plan.dropped_tags == ()
    assert "left off" not in resume.resumed_text("llama-70b", plan)


def test_a_stop_is_read_from_the_engines_audit_record_and_an_operators_stop_is_not_one() -> None:
    record = {
        "at": 500.0,
        "action": "stop",
        "diagnosis": "hang",
        "evidence": {"agent": {"step": 42.0, "last_step_t": 400.0}},
    }
    stop = resume.stop_of(record, {"stop": {"ok": True}, "slack": {"ok": True, "ts": "171.5"}})
    assert stop == StopRecord(at=500.0, diagnosis="hang", step=42.0, stall_onset=400.0, ok=True, slack_ts="171.5")
    assert resume.stop_of({"at": 1.0, "action": "stallwatch_stop_now"}, None) is None


def test_the_clone_copies_every_field_create_and_describe_share_and_passes_botocores_validation() -> None:
    # Given SageMaker's API model, as the SDK ships it
    import botocore.session
    from botocore.validate import ParamValidator

    model = botocore.session.get_session().get_service_model("sagemaker")
    create = model.operation_model("CreateTrainingJob").input_shape
    describe = model.operation_model("DescribeTrainingJob").output_shape

    # Then every field both calls have is cloned (a new one fails here), but those the clone sets itself
    shared = set(create.members) & set(describe.members)
    assert set(resume.CLONED_FIELDS) == shared - {"TrainingJobName", "AlgorithmSpecification", "StoppingCondition"}
    assert set(resume.ALGORITHM_FIELDS) == set(create.members["AlgorithmSpecification"].members)

    # ...and the request built from a DescribeTrainingJob answer is a valid CreateTrainingJob call
    plan = resume.plan_resume(described(), OPTED_IN, HANG_STOP, 0)
    assert isinstance(plan, ResumePlan)
    report = ParamValidator().validate(plan.request, create)
    assert not report.has_errors(), report.generate_report()


def test_progress_stamped_before_the_restart_reads_as_no_time_after_it() -> None:
    # Given the first step past the best, in a datapoint whose period began 2 s before the restart
    # When Slack is told, then the time after the restart is never negative
    assert (
        resume.progress_text("llama-r1", 350, -2.0)
        == ":white_check_mark: `llama-r1`: step 350 reached 0 s after the restart"
    )
    assert resume.progress_text("llama-r1", 12_400, 480.0).endswith("step 12,400 reached 8 min after the restart")
