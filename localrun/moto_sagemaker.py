"""A small moto extension: SageMaker training jobs that run and can be stopped.

moto 5.2.5 creates every training job as ``Completed`` and has no StopTrainingJob. After
`install()`, new jobs start ``InProgress`` (secondary status ``Starting``), `set_training_job_status`
moves a job along, and StopTrainingJob moves it to ``Stopping``; the next DescribeTrainingJob after that
reports ``Stopped``, as SageMaker does once the instances are released. CreateTrainingJob keeps what a
resume clones that moto drops (``Environment``, ``RetryStrategy``), rejects a name in use (``ResourceInUse``)
and a CheckpointConfig without an S3 URI, as SageMaker does; an ended job reports ``TrainingTimeInSeconds``.
`fail_create_training_job` makes the next CreateTrainingJob calls fail with a given error code (capacity short,
a throttle, a 5xx), and optionally only after creating the job, as when SageMaker took a call whose answer was lost.
The patch is on moto's backend and response classes, so it works in-process (``mock_aws``) and in a
``ThreadedMotoServer`` alike.

    from localrun import moto_sagemaker
    moto_sagemaker.install()
    moto_sagemaker.set_training_job_status("my-job", "InProgress", "Training")
    moto_sagemaker.fail_create_training_job("ResourceLimitExceeded", times=2)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import moto
from moto.core.common_types import TYPE_RESPONSE
from moto.core.exceptions import JsonRESTError
from moto.sagemaker.exceptions import ResourceInUseException, ValidationError
from moto.sagemaker.models import FakeTrainingJob, SageMakerModelBackend, sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse

MOTO_VERSION = "5.2.5"
if moto.__version__ != MOTO_VERSION:
    raise ImportError(
        f"localrun.moto_sagemaker patches moto internals and is pinned to moto=={MOTO_VERSION}; "
        f"found moto=={moto.__version__}. Install the pinned version (requirements-dev.txt) or update the patch."
    )

DEFAULT_ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-1"
RUNNING = "InProgress"
STOPPING = "Stopping"
STOPPED = "Stopped"
STATUS_MESSAGES = {
    "Starting": "Preparing the instances for training",
    "Downloading": "Downloading input data",
    "Training": "Training image download completed. Training in progress.",
    STOPPING: "Stopping the training job",
    STOPPED: "Training job stopped",
}

_original_init = FakeTrainingJob.__init__
_original_describe = SageMakerModelBackend.describe_training_job
_original_create_response = SageMakerResponse.create_training_job
# CreateTrainingJob parameters moto 5.2.5 does not keep, kept on the job (and so in DescribeTrainingJob).
KEPT_PARAMETERS = {"Environment": "environment", "RetryStrategy": "retry_strategy"}


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _init_in_progress(self: FakeTrainingJob, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    self.training_job_status = RUNNING
    self.secondary_status = "Starting"
    self.secondary_status_transitions[-1].pop("EndTime", None)
    self.training_end_time = None
    self.final_metric_data_list = None
    self.model_artifacts = None
    self.stop_requested = False


def _set_status(job: FakeTrainingJob, status: str, secondary_status: str, at: datetime | None = None) -> None:
    now = at or _now()
    if job.secondary_status_transitions:
        job.secondary_status_transitions[-1]["EndTime"] = now
    job.secondary_status_transitions.append(
        {"Status": secondary_status, "StartTime": now, "StatusMessage": STATUS_MESSAGES.get(secondary_status, "")}
    )
    job.training_job_status = status
    job.secondary_status = secondary_status
    job.last_modified_time = now
    job.creation_time = min(job.creation_time, now)
    if secondary_status == "Training":
        job.training_start_time = min(job.training_start_time, now)
    if status not in (RUNNING, STOPPING):
        job.training_end_time = now
        job.training_time_in_seconds = int((now - job.training_start_time).total_seconds())


def _stop_training_job(self: SageMakerModelBackend, training_job_name: str) -> None:
    job = self.training_jobs.get(training_job_name)
    if job is None:
        arn = FakeTrainingJob.arn_formatter(training_job_name, self.account_id, self.region_name)
        raise ValidationError(message=f"Requested resource not found: Could not find training job '{arn}'.")
    if job.training_job_status != RUNNING:
        raise ValidationError(
            message=f"The request was rejected because the training job is in status {job.training_job_status}."
        )
    _set_status(job, STOPPING, STOPPING)
    job.stop_requested = True


def _describe_training_job(self: SageMakerModelBackend, training_job_name: str) -> dict[str, Any]:
    response = _original_describe(self, training_job_name)
    job = self.training_jobs[training_job_name]
    if job.training_job_status == STOPPING and getattr(job, "stop_requested", False):
        # Reported once as Stopping; SageMaker then releases the instances.
        job.stop_requested = False
        return response
    if job.training_job_status == STOPPING:
        _set_status(job, STOPPED, STOPPED)
        return _original_describe(self, training_job_name)
    return response


def _stop_training_job_response(self: SageMakerResponse) -> TYPE_RESPONSE:
    self.sagemaker_backend.stop_training_job(self._get_param("TrainingJobName"))
    return 200, {}, "{}"


@dataclass(frozen=True)
class CreateFailure:
    """One CreateTrainingJob call answered with `code` (HTTP `status`); `after_create`: the job is created first."""

    code: str
    status: int
    after_create: bool


def _create_training_job_response(self: SageMakerResponse) -> Any:
    failures: list[CreateFailure] = getattr(self.sagemaker_backend, "create_failures", [])
    failure = failures.pop(0) if failures else None
    if failure is not None and not failure.after_create:
        raise _error(failure)
    response = _create_and_keep(self)
    if failure is not None:
        raise _error(failure)
    return response


def _error(failure: CreateFailure) -> JsonRESTError:
    error = JsonRESTError(failure.code, f"{failure.code} (injected by localrun.moto_sagemaker)")
    error.code = failure.status
    return error


def _create_and_keep(self: SageMakerResponse) -> Any:
    name = self._get_param("TrainingJobName")
    if name in self.sagemaker_backend.training_jobs:
        arn = FakeTrainingJob.arn_formatter(name, self.current_account, self.region)
        raise ResourceInUseException(
            f"Training job names must be unique within an AWS account and region, and a "
            f"training job with this name already exists ({arn})"
        )
    checkpoint = self._get_param("CheckpointConfig")
    if checkpoint is not None and not str(checkpoint.get("S3Uri", "")).startswith("s3://"):
        raise ValidationError(message="CheckpointConfig.S3Uri must be an s3:// URI")
    response = _original_create_response(self)
    job = self.sagemaker_backend.training_jobs[name]
    for parameter, attribute in KEPT_PARAMETERS.items():
        value = self._get_param(parameter)
        if value is not None:
            setattr(job, attribute, value)
    return response


def install() -> None:
    """Patch moto (idempotent): InProgress training jobs, StopTrainingJob, Stopping -> Stopped, and a
    CreateTrainingJob that keeps what a resume clones."""
    FakeTrainingJob.__init__ = _init_in_progress  # type: ignore[method-assign]
    SageMakerModelBackend.stop_training_job = _stop_training_job  # type: ignore[attr-defined]
    SageMakerModelBackend.describe_training_job = _describe_training_job  # type: ignore[method-assign]
    SageMakerResponse.stop_training_job = _stop_training_job_response  # type: ignore[attr-defined]
    SageMakerResponse.create_training_job = _create_training_job_response  # type: ignore[method-assign]


def set_training_job_status(
    name: str,
    status: str = RUNNING,
    secondary_status: str = "Training",
    at: float | None = None,
    account_id: str = DEFAULT_ACCOUNT,
    region: str = DEFAULT_REGION,
) -> None:
    """Move a job to `status` / `secondary_status` (at epoch `at`, default now), recording the transition.

    A move in the past also moves the job's creation back to it; to ``Training``, its training start too."""
    backend = sagemaker_backends[account_id][region]
    job = backend.training_jobs.get(name)
    if job is None:
        raise KeyError(f"no training job {name!r} in moto account {account_id} region {region}")
    _set_status(
        job, status, secondary_status, None if at is None else datetime.fromtimestamp(at, UTC).replace(tzinfo=None)
    )


def fail_create_training_job(
    code: str,
    times: int = 1,
    status: int = 400,
    after_create: bool = False,
    account_id: str = DEFAULT_ACCOUNT,
    region: str = DEFAULT_REGION,
) -> None:
    """Answer the next `times` CreateTrainingJob calls with error `code` and HTTP `status` (400 for
    ``ResourceLimitExceeded``; a 5xx or ``ThrottlingException`` is retried by botocore, each retry a call).
    `after_create`: the job is created before the error, as when SageMaker took a call whose answer was lost.
    The failures live on moto's backend, so a reset of moto clears them."""
    if times < 1 or not 400 <= status <= 599:
        raise ValueError(f"times must be >= 1 and status an HTTP error (400-599): got times={times}, status={status}")
    backend = sagemaker_backends[account_id][region]
    failures = backend.__dict__.setdefault("create_failures", [])
    failures.extend([CreateFailure(code, status, after_create)] * times)
