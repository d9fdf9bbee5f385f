"""The Logs subscription extension: a filter needs CloudWatch Logs' permission on its function, and delivers only the
events its pattern matches (moto hands every event to every filter, and checks no permission)."""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import boto3
import moto
import pytest
from moto.awslambda.models import LambdaBackend

from localrun import moto_logs_filter, moto_logs_subscription
from stallwatch.core import log_patterns

GROUP = "/aws/sagemaker/TrainingJobs"
STREAM = "llama/algo-1-1700000000"
ACCOUNT = "123456789012"
GROUP_ARN = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:{GROUP}:*"

moto_logs_filter.install()
moto_logs_subscription.install()


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("index.py", "def handler(event, context):\n    return event\n")
    return buffer.getvalue()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A log group with a stream, a function, and the deliveries moto makes to it."""
    delivered: list[dict[str, Any]] = []

    def record(self: Any, function_arn: str, filter_name: str, group: str, stream: str, events: Any) -> None:
        delivered.append(
            {"filter": filter_name, "group": group, "stream": stream, "messages": [e["message"] for e in events]}
        )

    monkeypatch.setattr(LambdaBackend, "send_log_event", record)
    with moto.mock_aws():
        logs, lambda_ = boto3.client("logs"), boto3.client("lambda")
        role = boto3.client("iam").create_role(RoleName="fn", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        function = lambda_.create_function(
            FunctionName="on-log-line",
            Runtime="python3.12",
            Role=role,
            Handler="index.handler",
            Code={"ZipFile": _zip()},
        )["FunctionArn"]
        logs.create_log_group(logGroupName=GROUP)
        logs.create_log_stream(logGroupName=GROUP, logStreamName=STREAM)
        yield {"logs": logs, "lambda": lambda_, "function": function, "delivered": delivered}


def _permit(aws: dict[str, Any], source_arn: str = GROUP_ARN, account: str = ACCOUNT) -> None:
    aws["lambda"].add_permission(
        FunctionName="on-log-line",
        StatementId="logs",
        Action="lambda:InvokeFunction",
        Principal="logs.amazonaws.com",
        SourceArn=source_arn,
        SourceAccount=account,
    )


def _subscribe(aws: dict[str, Any]) -> None:
    aws["logs"].put_subscription_filter(
        logGroupName=GROUP,
        filterName="stallwatch-fatal-lines",
        filterPattern=log_patterns.FATAL_FILTER_PATTERN,
        destinationArn=aws["function"],
    )


def _put(aws: dict[str, Any], *messages: str) -> None:
    now_ms = int(time.time() * 1000)
    events = [{"timestamp": now_ms + i, "message": m} for i, m in enumerate(messages)]
    aws["logs"].put_log_events(logGroupName=GROUP, logStreamName=STREAM, logEvents=events)


def test_a_filter_delivers_only_the_events_its_pattern_matches(aws: dict[str, Any]) -> None:
    # Given CloudWatch Logs may invoke the function for this group, and the fatal lines' filter
    _permit(aws)
    _subscribe(aws)
    # When a batch of ordinary and fatal lines is put, and then one of ordinary lines only
    _put(aws, "step 10 loss 2.31", "RuntimeError: CUDA error: an illegal memory access was encountered", "step 11")
    _put(aws, "step 12 loss 2.30", "step 13 loss 2.29")
    # Then one delivery was made, of the fatal line alone
    assert aws["delivered"] == [
        {
            "filter": "stallwatch-fatal-lines",
            "group": GROUP,
            "stream": STREAM,
            "messages": ["RuntimeError: CUDA error: an illegal memory access was encountered"],
        }
    ]


@pytest.mark.parametrize(
    ("source_arn", "account"),
    [(None, None), ("arn:aws:logs:us-east-1:123456789012:log-group:/other:*", ACCOUNT), (GROUP_ARN, "210987654321")],
    ids=["no-permission", "another-group", "another-account"],
)
def test_a_filter_needs_cloudwatch_logs_permission_on_its_function(
    aws: dict[str, Any], source_arn: str | None, account: str | None
) -> None:
    if source_arn is not None:
        _permit(aws, source_arn, account)
    with pytest.raises(aws["logs"].exceptions.InvalidParameterException, match="permission to execute"):
        _subscribe(aws)
    assert aws["logs"].describe_subscription_filters(logGroupName=GROUP)["subscriptionFilters"] == []


def test_a_filter_is_updated_in_its_own_slot_when_both_are_taken(aws: dict[str, Any]) -> None:
    # Given ours and another filter: both slots taken
    _permit(aws)
    _subscribe(aws)
    aws["logs"].put_subscription_filter(
        logGroupName=GROUP, filterName="other", filterPattern="", destinationArn=aws["function"]
    )
    # When ours is put again with another pattern, Then it is updated; a third filter is refused
    aws["logs"].put_subscription_filter(
        logGroupName=GROUP,
        filterName="stallwatch-fatal-lines",
        filterPattern='?"Traceback"',
        destinationArn=aws["function"],
    )
    found = aws["logs"].describe_subscription_filters(logGroupName=GROUP)["subscriptionFilters"]
    assert {f["filterName"]: f["filterPattern"] for f in found} == {
        "stallwatch-fatal-lines": '?"Traceback"',
        "other": "",
    }
    with pytest.raises(aws["logs"].exceptions.LimitExceededException):
        aws["logs"].put_subscription_filter(
            logGroupName=GROUP, filterName="third", filterPattern="", destinationArn=aws["function"]
        )
