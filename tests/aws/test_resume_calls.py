"""A resume's platform calls: failures returned with their code and whether a later try may succeed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ParamValidationError, ReadTimeoutError

from stallwatch.aws.resume import create_training_job, start_instances

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
