"""One format for what AWS refused, in every adapter that returns API errors: SSM Run Command, Auto Scaling, stops
and resumes say "<call>: <code>: <message>", and an answer without a code reads "Unknown" instead of raising."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from stallwatch.aws import actions, autoscaling, ssm
from stallwatch.aws.api_errors import ApiError, api_error
from stallwatch.aws.platforms import adapter
from stallwatch.aws.platforms.sagemaker import create_training_job
from stallwatch.core.signals import JobFacts, Platform


class Refusing:
    """A client whose every call raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def call(**kwargs: Any) -> Any:
            raise self.error

        return call


def _clients(error: Exception) -> Any:
    refusing = Refusing(error)
    return SimpleNamespace(sagemaker=refusing, ec2=refusing, ssm=refusing, autoscaling=refusing)


def _refused(response: dict[str, Any]) -> ClientError:
    return ClientError(response, "Operation")  # type: ignore[arg-type]


DENIED = _refused(
    {"Error": {"Code": "AccessDeniedException", "Message": "no"}, "ResponseMetadata": {"HTTPStatusCode": 400}}
)
CODELESS = _refused({"ResponseMetadata": {"HTTPStatusCode": 500}})
JOB = JobFacts("llama", Platform.SAGEMAKER, "InProgress", "Training", 0.0, "ml.p4d.24xlarge", 1, 8, 96)


def _details(error: Exception) -> list[str]:
    """What each adapter says of `error`: the SSM send, the node marked unhealthy, the stop, the resume."""
    clients = _clients(error)
    return [
        ssm.send(clients, "doc", ("i-0123456789abcdef0",), "comment", timeout_s=60).error,
        autoscaling.mark_unhealthy(clients, "i-0123456789abcdef0") or "",
        actions.stop(adapter(JOB.platform, clients), JOB).detail,
        create_training_job(clients, {"TrainingJobName": "llama-r1", "Tags": []}).detail,
    ]


def test_every_adapter_says_a_refusal_the_same_way() -> None:
    assert _details(DENIED) == [
        "SendCommand doc to ['i-0123456789abcdef0']: AccessDeniedException: no",
        "SetInstanceHealth i-0123456789abcdef0: AccessDeniedException: no",
        "StopTrainingJob llama: AccessDeniedException: no",
        "CreateTrainingJob llama-r1: AccessDeniedException: no",
    ]


def test_an_answer_without_an_error_code_is_unknown_everywhere_and_never_raised() -> None:
    # Given a refusal whose answer names no error (a 5xx from a proxy, say): a stop returns it like any other
    assert [d.split(": ", 1)[1] for d in _details(CODELESS)] == ["Unknown: "] * 4


def test_an_unanswered_call_says_its_exception() -> None:
    error = EndpointConnectionError(endpoint_url="https://api.sagemaker.us-east-1.amazonaws.com")
    assert api_error(error) == ApiError("EndpointConnectionError", str(error))
    assert actions.stop(adapter(JOB.platform, _clients(error)), JOB).detail == f"EndpointConnectionError: {error}"
    assert create_training_job(_clients(error), {"TrainingJobName": "j", "Tags": []}).code == "ConnectionError"


@pytest.mark.parametrize(("error", "status"), [(DENIED, 400), (CODELESS, 500)])
def test_the_http_status_is_kept(error: ClientError, status: int) -> None:
    assert api_error(error).status == status
