"""The SageMaker side of the run: the training-job record in moto and what SageMaker does with it.

SageMaker's own behaviour is played here: the job's status follows the container, a StopTrainingJob
(Stopping) sends SIGTERM to the training process, and every status change is delivered to on_job_state
as an EventBridge event.
"""

from __future__ import annotations

from typing import Any

from moto.sagemaker.models import sagemaker_backends

from localrun import aws_events, moto_sagemaker
from localrun.aws_events import TrainingJobRecord
from localrun.local_aws import ACCOUNT_ID, REGION
from localrun.moto_sagemaker import RUNNING, STOPPED, STOPPING
from localrun.scenarios import CHECKPOINT_S3_URI, INSTANCE_TYPE, MAX_RUNTIME_S, RESUME_TAGS, Scenario
from stallwatch.core.contract import SAGEMAKER_LOG_GROUP
from stallwatch.core.signals import Platform

COMPLETED, FAILED = "Completed", "Failed"

ROLE_ARN = f"arn:aws:iam::{ACCOUNT_ID}:role/stallwatch-demo-training"
IMAGE = f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch-training:2.5-cpu-py311"
OUTPUT_PATH = "s3://stallwatch-demo/output"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"  # SageMaker's; the demo's hosts use a temporary directory


def create_training_job(sagemaker: Any, scenario: Scenario, now: float, resume: bool = False) -> TrainingJobRecord:
    """CreateTrainingJob with the scenario's tags; moto (with the extension) reports it InProgress/Starting.
    With `resume`, the job opts in to a restart and has a CheckpointConfig."""
    name = f"stallwatch-demo-{scenario.name}-{int(now)}"
    tags = scenario.tags | (RESUME_TAGS if resume else {})
    extra: dict[str, Any] = {}
    if resume:
        extra["CheckpointConfig"] = {"S3Uri": f"{CHECKPOINT_S3_URI}/{name}", "LocalPath": CHECKPOINT_LOCAL_PATH}
    sagemaker.create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        RoleArn=ROLE_ARN,
        OutputDataConfig={"S3OutputPath": OUTPUT_PATH},
        ResourceConfig={"InstanceType": INSTANCE_TYPE, "InstanceCount": len(scenario.hosts), "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": MAX_RUNTIME_S},
        Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
        **extra,
    )
    return job_record(sagemaker, name)


def job_record(sagemaker: Any, name: str) -> TrainingJobRecord:
    """A training job in moto (one the demo created, or one Stallwatch resumed) as the run plays it."""
    described = sagemaker.describe_training_job(TrainingJobName=name)
    tags = [
        t
        for page in sagemaker.get_paginator("list_tags").paginate(ResourceArn=described["TrainingJobArn"])
        for t in page["Tags"]
    ]
    resources = described["ResourceConfig"]
    return TrainingJobRecord(
        name=name,
        arn=described["TrainingJobArn"],
        instance_type=resources["InstanceType"],
        instance_count=resources["InstanceCount"],
        tags={t["Key"]: t["Value"] for t in tags},
        created_at=described["CreationTime"].timestamp(),
        role_arn=described["RoleArn"],
        image=described["AlgorithmSpecification"]["TrainingImage"],
        max_runtime_s=described["StoppingCondition"]["MaxRuntimeInSeconds"],
    )


def log_stream_name(job: TrainingJobRecord, host: str) -> str:
    """SageMaker's stream name for a host's container: ``<job>/algo-1-<epoch>``."""
    return f"{job.name}/{host}-{int(job.created_at)}"


def platform_status(job: TrainingJobRecord) -> tuple[str, str]:
    """The job's (status, secondary status) as SageMaker itself knows it (read without an API call,
    since the extension advances Stopping -> Stopped on DescribeTrainingJob)."""
    record = sagemaker_backends[ACCOUNT_ID][REGION].training_jobs[job.name]
    return record.training_job_status, record.secondary_status


def set_status(job: TrainingJobRecord, status: str, secondary_status: str) -> None:
    moto_sagemaker.set_training_job_status(job.name, status, secondary_status, account_id=ACCOUNT_ID, region=REGION)


class SageMakerJob:
    """A training job in moto as the run drives it (the same face as `ec2_cluster.Ec2Cluster`)."""

    platform = Platform.SAGEMAKER

    def __init__(self, sagemaker: Any, record: TrainingJobRecord, hosts: list[str]) -> None:
        self._sagemaker = sagemaker
        self.record = record
        self.name, self.created_at, self.tags = record.name, record.created_at, record.tags
        self.instance_type, self.instance_count = record.instance_type, record.instance_count
        self.hosts = hosts

    @classmethod
    def create(cls, sagemaker: Any, scenario: Scenario, now: float, resume: bool = False) -> SageMakerJob:
        return cls(sagemaker, create_training_job(sagemaker, scenario, now, resume), scenario.hosts)

    def describe(self) -> str:
        return f"CreateTrainingJob {self.name} ({self.instance_count} x {self.instance_type})"

    def log_place(self, host: str) -> tuple[str, str]:
        return SAGEMAKER_LOG_GROUP, log_stream_name(self.record, host)

    def training_env(self, host: str) -> dict[str, str]:
        """What SageMaker sets in the container."""
        return {"TRAINING_JOB_NAME": self.name, "SM_CURRENT_HOST": host}

    def start(self, t: float) -> list[dict[str, Any]]:
        set_status(self.record, RUNNING, "Training")
        return [aws_events.training_job_state_change(self.record, RUNNING, "Training", t)]

    def status(self) -> tuple[str, str]:
        return platform_status(self.record)

    def stopped(self, t: float) -> list[dict[str, Any]]:
        """The containers are gone after a StopTrainingJob: the job is Stopped."""
        if platform_status(self.record)[0] == STOPPING:
            set_status(self.record, STOPPED, STOPPED)
        return [aws_events.training_job_state_change(self.record, STOPPED, STOPPED, t)]

    def finish(self, failed: bool, t: float) -> list[dict[str, Any]]:
        """Every training process exited on its own: Completed, or Failed on a non-zero exit."""
        end = FAILED if failed else COMPLETED
        set_status(self.record, end, end)
        reason = "AlgorithmError: non-zero exit" if failed else None
        return [aws_events.training_job_state_change(self.record, end, end, t, reason)]

    def final_status(self) -> str:
        return self._sagemaker.describe_training_job(TrainingJobName=self.name)["TrainingJobStatus"]
