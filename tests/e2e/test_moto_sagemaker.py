"""The moto extension: training jobs run (InProgress) and StopTrainingJob moves them to Stopping, then Stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import boto3
import moto
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from localrun import moto_sagemaker

JOB = "bert-large-42"


def _create(sagemaker: Any, name: str = JOB, **extra: Any) -> None:
    """CreateTrainingJob of a 2-host job; `extra` adds request fields (CheckpointConfig, Environment, ...)."""
    sagemaker.create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={"TrainingImage": "train:latest", "TrainingInputMode": "File"},
        RoleArn="arn:aws:iam::123456789012:role/training",
        OutputDataConfig={"S3OutputPath": "s3://bucket/out"},
        ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
        **extra,
    )


@pytest.fixture
def sagemaker() -> Iterator[Any]:
    moto_sagemaker.install()  # idempotent; conftest installs it too
    with moto.mock_aws():
        yield boto3.client("sagemaker", region_name="us-east-1")


def test_created_job_is_in_progress_and_can_move_to_training(sagemaker: Any) -> None:
    # Given a job created on moto with the extension installed
    _create(sagemaker)
    assert sagemaker.describe_training_job(TrainingJobName=JOB)["TrainingJobStatus"] == "InProgress"

    # When it moves to Training an hour ago
    started = time.time() - 3600
    moto_sagemaker.set_training_job_status(JOB, "InProgress", "Training", at=started)

    # Then DescribeTrainingJob reports it running, with the transition and the training start
    job = sagemaker.describe_training_job(TrainingJobName=JOB)
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Training")
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]] == ["Starting", "Training"]
    assert abs(job["TrainingStartTime"].timestamp() - started) < 1
    assert [
        j["TrainingJobName"] for j in sagemaker.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]
    ] == [JOB]


def test_stop_moves_the_job_to_stopping_then_stopped(sagemaker: Any) -> None:
    # Given a running job
    _create(sagemaker)
    moto_sagemaker.set_training_job_status(JOB)

    # When it is stopped
    sagemaker.stop_training_job(TrainingJobName=JOB)

    # Then it reports Stopping once, then Stopped
    assert sagemaker.describe_training_job(TrainingJobName=JOB)["TrainingJobStatus"] == "Stopping"
    job = sagemaker.describe_training_job(TrainingJobName=JOB)
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "TrainingEndTime" in job


def test_stopping_a_stopped_or_unknown_job_is_a_validation_error(sagemaker: Any) -> None:
    # Given a job that was stopped
    _create(sagemaker)
    sagemaker.stop_training_job(TrainingJobName=JOB)

    # When it is stopped again, Then SageMaker's "already stopping" answer comes back
    with pytest.raises(ClientError, match="in status Stopping") as stopped:
        sagemaker.stop_training_job(TrainingJobName=JOB)
    assert stopped.value.response["Error"]["Code"] == "ValidationException"

    # And an unknown job is not found
    with pytest.raises(ClientError, match="Could not find training job"):
        sagemaker.stop_training_job(TrainingJobName="nope")


def test_unknown_job_status_helper_names_the_job() -> None:
    with moto.mock_aws(), pytest.raises(KeyError, match="no training job 'ghost'"):
        moto_sagemaker.set_training_job_status("ghost")


def test_stop_works_through_a_threaded_moto_server(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a moto server on 127.0.0.1, as the local demo runs it
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        sagemaker = boto3.client("sagemaker", region_name="us-east-1", endpoint_url=f"http://{host}:{port}")
        _create(sagemaker, "served-job")

        # When the job is stopped over HTTP
        sagemaker.stop_training_job(TrainingJobName="served-job")

        # Then the server moved it to Stopping, then Stopped
        assert sagemaker.describe_training_job(TrainingJobName="served-job")["TrainingJobStatus"] == "Stopping"
        assert sagemaker.describe_training_job(TrainingJobName="served-job")["TrainingJobStatus"] == "Stopped"
    finally:
        server.stop()


def test_create_keeps_checkpoint_config_and_environment_and_rejects_a_name_in_use(sagemaker: Any) -> None:
    # Given a job created with what a resume clones (CheckpointConfig, Environment)
    _create(
        sagemaker,
        CheckpointConfig={"S3Uri": "s3://bucket/ckpt", "LocalPath": "/opt/ml/checkpoints"},
        Environment={"NCCL_DEBUG": "WARN"},
    )

    # Then DescribeTrainingJob returns them, as SageMaker does
    described = sagemaker.describe_training_job(TrainingJobName=JOB)
    assert described["CheckpointConfig"] == {"S3Uri": "s3://bucket/ckpt", "LocalPath": "/opt/ml/checkpoints"}
    assert described["Environment"] == {"NCCL_DEBUG": "WARN"}

    # ...a second job of that name is refused, and a CheckpointConfig needs an S3 URI
    with pytest.raises(ClientError) as in_use:
        _create(sagemaker)
    assert in_use.value.response["Error"]["Code"] == "ResourceInUse"
    with pytest.raises(ClientError) as bad:
        _create(sagemaker, "other", CheckpointConfig={"S3Uri": "/local/only"})
    assert bad.value.response["Error"]["Code"] == "ValidationException"


def test_a_stopped_job_reports_its_training_time(sagemaker: Any) -> None:
    _create(sagemaker)
    started = time.time() - 600
    moto_sagemaker.set_training_job_status(JOB, "InProgress", "Training", at=started)
    moto_sagemaker.set_training_job_status(JOB, "Stopped", "Stopped", at=started + 500)
    described = sagemaker.describe_training_job(TrainingJobName=JOB)
    assert described["TrainingTimeInSeconds"] == 500
    assert described["TrainingEndTime"].timestamp() == pytest.approx(started + 500, abs=1)


def test_create_training_job_fails_the_next_calls_with_the_given_code_then_creates(sagemaker: Any) -> None:
    # Given CreateTrainingJob set to fail twice for capacity
    moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=2)

    # When it is called three times, Then the first two are refused (HTTP 400) and create nothing; the third creates
    for _ in range(2):
        with pytest.raises(ClientError) as refused:
            _create(sagemaker)
        error = refused.value.response
        assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == ("ResourceLimitExceeded", 400)
        assert sagemaker.list_training_jobs()["TrainingJobSummaries"] == []
    _create(sagemaker)
    assert sagemaker.describe_training_job(TrainingJobName=JOB)["TrainingJobStatus"] == "InProgress"


def test_a_failure_after_create_leaves_the_job_created_and_a_second_call_finds_it_in_use(sagemaker: Any) -> None:
    # Given a CreateTrainingJob whose answer is lost after SageMaker took it (a 500, not retried here)
    moto_sagemaker.fail_create_training_job("InternalFailure", status=500, after_create=True)
    once = boto3.client("sagemaker", region_name="us-east-1", config=Config(retries={"total_max_attempts": 1}))

    # When it is called, Then it fails with the 500, yet the job exists
    with pytest.raises(ClientError) as failed:
        _create(once)
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500, failed.value.response
    assert sagemaker.describe_training_job(TrainingJobName=JOB)["TrainingJobName"] == JOB

    # And a second call for the same name is refused as in use
    with pytest.raises(ClientError) as in_use:
        _create(sagemaker)
    assert in_use.value.response["Error"]["Code"] == "ResourceInUse"


def test_injected_failures_end_with_moto_s_reset_and_bad_arguments_are_refused() -> None:
    moto_sagemaker.install()
    with moto.mock_aws():
        moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=5)
    with moto.mock_aws():  # a fresh moto: the failures were its predecessor's
        _create(boto3.client("sagemaker", region_name="us-east-1"))
    with pytest.raises(ValueError, match="times must be >= 1"):
        moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=0)
    with pytest.raises(ValueError, match="status an HTTP error"):
        moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", status=200)
