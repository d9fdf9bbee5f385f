"""A resume's platform calls: failures returned with their code and whether a later try may succeed."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ParamValidationError, ReadTimeoutError
from botocore.stub import Stubber

from stallwatch.aws.platforms.ec2 import start_instances
from stallwatch.aws.platforms.sagemaker import create_training_job
from stallwatch.aws.platforms.sagemaker_goodput import describe_training_job

REQUEST = {"TrainingJobName": "llama-r1", "Tags": []}


class Refusing:
    """A client whose call raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def create_training_job(self, **kwargs: Any) -> dict[str, Any]:
        raise self.error

    def start_instances(self, **kwargs: Any) -> dict[str, Any]:
        raise self.error


def _client_error(code: str, status: int) -> ClientError:
    response = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "CreateTrainingJob")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "code", "transient"),
    [
        (ReadTimeoutError(endpoint_url="https://api.sagemaker"), "ConnectionError", True),
        (EndpointConnectionError(endpoint_url="https://api.sagemaker"), "ConnectionError", True),
        (ParamValidationError(report="bad"), "ParamValidationError", False),
        (_client_error("ResourceLimitExceeded", 400), "ResourceLimitExceeded", True),
        (_client_error("ServiceUnavailable", 503), "ServiceUnavailable", True),
        (_client_error("AccessDeniedException", 400), "AccessDeniedException", False),
    ],
)
def test_a_failed_call_is_returned_with_its_code_and_whether_to_retry(error, code, transient) -> None:
    for started in (
        create_training_job(SimpleNamespace(sagemaker=Refusing(error)), REQUEST),
        start_instances(SimpleNamespace(ec2=Refusing(error)), ("i-0abc",)),
    ):
        assert (started.ok, started.code, started.transient) == (False, code, transient)


def test_a_jobs_tags_are_read_from_every_page_of_list_tags() -> None:
    # Given a SageMaker client whose ListTags answers in two pages (botocore's Stubber checks each request)
    sagemaker = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="s")
    arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/llama"
    stubber = Stubber(sagemaker)
    stubber.add_response("describe_training_job", _described(arn), {"TrainingJobName": "llama"})
    pages = [
        ({"Tags": [{"Key": "team", "Value": "nlp"}], "NextToken": "t"}, {}),
        ({"Tags": [{"Key": "stallwatch:mode", "Value": "enforce"}]}, {"NextToken": "t"}),
    ]
    for answer, extra in pages:
        stubber.add_response("list_tags", answer, {"ResourceArn": arn, **extra})

    # When the job is described
    with stubber:
        described, tags = describe_training_job(SimpleNamespace(sagemaker=sagemaker), "llama")

    # Then the tags of both pages are the job's, one call a page
    stubber.assert_no_pending_responses()
    assert (described["TrainingJobArn"], tags) == (arn, {"team": "nlp", "stallwatch:mode": "enforce"})


def _described(arn: str) -> dict[str, Any]:
    """The fields DescribeTrainingJob always answers with."""
    return {
        "TrainingJobName": "llama",
        "TrainingJobArn": arn,
        "ModelArtifacts": {"S3ModelArtifacts": "s3://bucket/out/model.tar.gz"},
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Training",
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86_400},
        "CreationTime": datetime(2026, 11, 30, tzinfo=UTC),
    }
