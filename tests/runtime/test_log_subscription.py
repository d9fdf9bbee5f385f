"""The custom resource of SageMaker's shared log group: created if absent, our filter put where a slot is free, never
another filter removed, and CloudFormation always answered (moto; the answers received on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import moto
import pytest
from botocore.exceptions import ClientError

from handlers import log_subscription
from localrun import moto_logs_subscription
from localrun.moto_world import LambdaContext
from localrun.stack_on_moto import AnswerReceiver, custom_resource_request
from stallwatch.core import contract, log_patterns
from stallwatch.runtime import log_subscription as runtime_log_subscription
from tests.fixtures.request_limits import recording

GROUP = contract.SAGEMAKER_LOG_GROUP
OURS = "arn:aws:lambda:us-east-1:123456789012:function:stallwatch-on-log-line"
PROPS = {
    "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:stallwatch-subscriber",
    "LogGroupName": GROUP,
    "FilterName": "stallwatch-fatal-lines",
    "FilterPattern": log_patterns.FATAL_FILTER_PATTERN,
    "DestinationArn": OURS,
}
THEIRS = "arn:aws:lambda:us-east-1:123456789012:function:datadog-forwarder"

moto_logs_subscription.install()  # PutSubscriptionFilter updates a filter in its own slot, as CloudWatch Logs does


@pytest.fixture
def logs() -> Iterator[Any]:
    """moto's Logs, with no SageMaker group (a fresh account); functions for the filters to name."""
    with moto.mock_aws():
        yield boto3.client("logs")


@pytest.fixture
def cloudformation() -> Iterator[AnswerReceiver]:
    with AnswerReceiver() as receiver:
        yield receiver


def _request(receiver: AnswerReceiver, request_type: str = "Create", **props: str) -> dict[str, Any]:
    physical = None if request_type == "Create" else f"{GROUP}:stallwatch-fatal-lines"
    return custom_resource_request(request_type, "SageMakerSubscription", {**PROPS, **props}, receiver.url, physical)


def _filters(logs: Any) -> dict[str, str]:
    found = logs.describe_subscription_filters(logGroupName=GROUP)["subscriptionFilters"]
    return {f["filterName"]: f["destinationArn"] for f in found}


def _theirs(logs: Any, *names: str) -> None:
    """Other tools' filters on the group (moto checks only that a Lambda destination exists: any will do)."""
    logs.create_log_group(logGroupName=GROUP)
    for name in names:
        logs.put_subscription_filter(logGroupName=GROUP, filterName=name, filterPattern="", destinationArn=THEIRS)


@pytest.fixture(autouse=True)
def functions(logs: Any) -> None:
    role = boto3.client("iam").create_role(RoleName="fn", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    for arn in (OURS, THEIRS):
        name = arn.rsplit(":", 1)[1]
        lambda_ = boto3.client("lambda")
        code = {"ZipFile": b"PK\x05\x06" + b"\0" * 18}
        lambda_.create_function(FunctionName=name, Runtime="python3.12", Role=role, Handler="index.handler", Code=code)
        lambda_.add_permission(
            FunctionName=name,
            StatementId="logs",
            Action="lambda:InvokeFunction",
            Principal="logs.amazonaws.com",
            SourceArn=f"arn:aws:logs:us-east-1:123456789012:log-group:{GROUP}:*",
        )


def test_a_fresh_account_gets_the_group_and_our_filter(logs: Any, cloudformation: AnswerReceiver) -> None:
    with recording() as requests:
        result = log_subscription.handler(_request(cloudformation), LambdaContext())
    assert [v for r in requests for v in r.violations()] == []
    assert {r.operation for r in requests} == {"CreateLogGroup", "DescribeSubscriptionFilters", "PutSubscriptionFilter"}
    assert _filters(logs) == {"stallwatch-fatal-lines": OURS}
    [answer] = cloudformation.answers
    assert (answer["Status"], answer["Data"]["Subscribed"], answer["PhysicalResourceId"]) == (
        "SUCCESS",
        "true",
        f"{GROUP}:stallwatch-fatal-lines",
    )
    assert answer["RequestId"] == "create-1"
    assert result["Subscribed"] == "true"


def test_a_free_slot_beside_another_tools_filter_is_taken(logs: Any, cloudformation: AnswerReceiver) -> None:
    _theirs(logs, "splunk")
    log_subscription.handler(_request(cloudformation), LambdaContext())
    assert _filters(logs) == {"splunk": THEIRS, "stallwatch-fatal-lines": OURS}


def test_both_slots_taken_changes_nothing_and_the_deploy_goes_on_saying_why(
    logs: Any, cloudformation: AnswerReceiver
) -> None:
    # Given two other tools' filters on the shared group
    _theirs(logs, "splunk", "datadog")
    # When the stack creates the resource
    log_subscription.handler(_request(cloudformation), LambdaContext())
    # Then both stay, ours is not there, and CloudFormation hears success with the reason
    assert _filters(logs) == {"splunk": THEIRS, "datadog": THEIRS}
    [answer] = cloudformation.answers
    assert (answer["Status"], answer["Data"]["Subscribed"]) == ("SUCCESS", "false")
    assert "both subscription filter slots" in answer["Data"]["Detail"]
    assert "splunk" in answer["Data"]["Detail"]
    assert "datadog" in answer["Data"]["Detail"]


def test_an_update_replaces_our_filter_in_its_own_slot(logs: Any, cloudformation: AnswerReceiver) -> None:
    # Given our filter and another tool's: both slots taken
    _theirs(logs, "splunk")
    log_subscription.handler(_request(cloudformation), LambdaContext())
    # When the pattern changes (users' extra fatal patterns), Then ours is updated in place
    log_subscription.handler(_request(cloudformation, "Update", FilterPattern='?"Fatal Python error"'), LambdaContext())
    found = logs.describe_subscription_filters(logGroupName=GROUP)["subscriptionFilters"]
    assert {f["filterName"]: f["filterPattern"] for f in found}["stallwatch-fatal-lines"] == '?"Fatal Python error"'
    assert cloudformation.answers[-1]["Data"]["Subscribed"] == "true"


def test_delete_removes_ours_and_never_another(logs: Any, cloudformation: AnswerReceiver) -> None:
    # Given ours beside another tool's, and then one of our name that points elsewhere
    _theirs(logs, "splunk")
    log_subscription.handler(_request(cloudformation), LambdaContext())
    # When the stack is deleted, Then only ours goes
    log_subscription.handler(_request(cloudformation, "Delete"), LambdaContext())
    assert _filters(logs) == {"splunk": THEIRS}
    logs.put_subscription_filter(
        logGroupName=GROUP, filterName="stallwatch-fatal-lines", filterPattern="", destinationArn=THEIRS
    )
    log_subscription.handler(_request(cloudformation, "Delete"), LambdaContext())
    assert _filters(logs) == {"splunk": THEIRS, "stallwatch-fatal-lines": THEIRS}
    assert [a["Status"] for a in cloudformation.answers] == ["SUCCESS"] * 3


def test_create_never_takes_over_a_filter_of_our_name_that_sends_elsewhere(
    logs: Any, cloudformation: AnswerReceiver
) -> None:
    # Given a filter of our name on the shared group, sending to another function (another's: put first)
    _theirs(logs, "stallwatch-fatal-lines")

    # When the stack creates the resource, and later deletes it
    log_subscription.handler(_request(cloudformation), LambdaContext())
    log_subscription.handler(_request(cloudformation, "Delete"), LambdaContext())

    # Then the other filter is never overwritten nor removed, and CloudFormation hears why ours is not there
    assert _filters(logs) == {"stallwatch-fatal-lines": THEIRS}
    created, deleted = cloudformation.answers
    assert (created["Status"], created["Data"]["Subscribed"]) == ("SUCCESS", "false")
    assert created["Data"]["Detail"] == (
        f"a filter of our name on {GROUP} is another's: stallwatch-fatal-lines (→ {THEIRS})"
    )
    assert deleted["Data"]["Detail"] == "no filter of ours was there"


def test_an_update_that_moves_our_filter_to_a_new_function_replaces_it_in_its_slot(
    logs: Any, cloudformation: AnswerReceiver
) -> None:
    # Given our filter, sending to the function an update replaces
    log_subscription.handler(_request(cloudformation, DestinationArn=THEIRS), LambdaContext())
    assert _filters(logs) == {"stallwatch-fatal-lines": THEIRS}

    # When the update names the new function (and, as CloudFormation does, the old properties)
    update = _request(cloudformation, "Update") | {"OldResourceProperties": {**PROPS, "DestinationArn": THEIRS}}
    log_subscription.handler(update, LambdaContext())

    # Then ours sends to the new one; without the old properties, the filter would be another's and left
    assert _filters(logs) == {"stallwatch-fatal-lines": OURS}
    assert cloudformation.answers[-1]["Data"]["Subscribed"] == "true"


def test_an_aws_error_fails_the_resource_with_its_reason(
    cloudformation: AnswerReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*args: Any) -> None:
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}, "CreateLogGroup")

    monkeypatch.setattr(runtime_log_subscription, "subscribe", denied)
    result = log_subscription.handler(_request(cloudformation), LambdaContext())
    assert result["status"] == "FAILED"
    [answer] = cloudformation.answers
    assert answer["Status"] == "FAILED"
    assert "AccessDeniedException" in answer["Reason"]


def test_an_unreadable_request_is_failed_where_it_says_where_to_answer(cloudformation: AnswerReceiver) -> None:
    request = _request(cloudformation)
    request["ResourceProperties"]["FilterName"] = "no:colons*allowed"
    assert log_subscription.handler(request, LambdaContext())["status"] == "FAILED"
    [answer] = cloudformation.answers
    assert answer["Status"] == "FAILED"
    assert "FilterName" in answer["Reason"]
