"""Fatal lines wake the engine: the subscription filters, the permissions CloudWatch Logs invokes on_log_line with, the
SageMaker group's custom resource, and the functions' least privilege."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk.assertions import Match, Template

from stacks.platforms.sagemaker import CUSTOM_RESOURCE_TYPE, SUBSCRIPTION_ACTIONS
from stacks.stallwatch_stack import StallwatchStack
from stallwatch.core import log_patterns
from stallwatch.core.config import EC2_LOG_GROUP, ON_LOG_LINE_TIMEOUT_SECONDS, StallwatchConfig
from stallwatch.core.contract import SAGEMAKER_LOG_GROUP

from .conftest import as_list, build_app, logical_id

FILTER = "stallwatch-fatal-lines"
PATTERN = StallwatchConfig().policy.fatal_filter_pattern  # the fatal lines and the agent's stall record
SLURM_GROUP = StallwatchConfig().log_group("slurm")


def _group_arn(group: str) -> dict[str, Any]:
    return {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":logs:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                f":log-group:{group}",
            ],
        ]
    }


def _arn(logical: str) -> dict[str, Any]:
    return {"Fn::GetAtt": [logical, "Arn"]}


def _subscriber(stack: StallwatchStack) -> Any:
    """The SageMaker group's custom resource's function."""
    return stack.platforms["sagemaker"].subscriber  # type: ignore[attr-defined]


def _role_statements(template: Template, role: str) -> list[dict[str, Any]]:
    return [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        if {"Ref": role} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_ec2_and_slurm_groups_send_their_fatal_lines_to_on_log_line(
    slurm_template: Template, slurm_stack: StallwatchStack
) -> None:
    template, stack = slurm_template, slurm_stack
    found = template.find_resources("AWS::Logs::SubscriptionFilter").values()
    filters = {f["Properties"]["LogGroupName"]["Ref"]: f for f in found}
    slurm_group = stack.platforms["slurm"].actions.log_group  # type: ignore[attr-defined]
    groups = {logical_id(stack.ec2_training.log_group): EC2_LOG_GROUP, logical_id(slurm_group): SLURM_GROUP}
    assert set(filters) == set(groups)
    for group, name in groups.items():
        assert filters[group]["Properties"] == {
            "LogGroupName": {"Ref": group},
            "FilterName": FILTER,
            "FilterPattern": PATTERN,
            "DestinationArn": _arn(logical_id(stack.watchdog.on_log_line)),
        }
        # And each is created after the permission CloudWatch Logs invokes the function with for its group
        [permission] = filters[group]["DependsOn"]
        assert template.to_json()["Resources"][permission]["Properties"]["SourceArn"] == _group_arn(f"{name}:*")
    assert len(PATTERN) <= 1024  # PutSubscriptionFilter's filterPattern
    assert log_patterns.passes_fatal_filter('{"StallwatchStacks":1,"Rank":3}', PATTERN)


def test_cloudwatch_logs_may_invoke_on_log_line_only_for_the_three_groups_of_this_account(
    slurm_template: Template, slurm_stack: StallwatchStack
) -> None:
    template, stack = slurm_template, slurm_stack
    permissions = [
        p["Properties"]
        for p in template.find_resources("AWS::Lambda::Permission").values()
        if p["Properties"]["Principal"] == "logs.amazonaws.com"
    ]
    assert sorted(str(p["SourceArn"]) for p in permissions) == sorted(
        str(_group_arn(f"{group}:*")) for group in (EC2_LOG_GROUP, SLURM_GROUP, SAGEMAKER_LOG_GROUP)
    )
    for permission in permissions:
        assert permission["Action"] == "lambda:InvokeFunction"
        assert permission["FunctionName"] == _arn(logical_id(stack.watchdog.on_log_line))
        assert permission["SourceAccount"] == {"Ref": "AWS::AccountId"}


def test_on_log_line_may_act_on_hyperpod_nodes_only_where_the_slurm_group_is_subscribed(
    slurm_template: Template, slurm_stack: StallwatchStack, tmp_path: Path
) -> None:
    template, stack = slurm_template, slurm_stack

    def sends(template: Template, role: str) -> bool:
        return any(s.get("Sid") == "HyperPodClusterNodes" for s in _role_statements(template, role))

    assert sends(template, logical_id(stack.watchdog.on_log_line.role))
    slurm = {"monitor": True, "log_subscription": False}
    _, [unsubscribed] = build_app(tmp_path, stallwatch={"platforms": {"slurm": slurm}})
    other = Template.from_stack(unsubscribed)
    assert not sends(other, logical_id(unsubscribed.watchdog.on_log_line.role))
    assert sends(other, logical_id(unsubscribed.watchdog.on_alarm.role))
    assert len(other.find_resources("AWS::Logs::SubscriptionFilter")) == 1


def test_sagemakers_shared_group_is_subscribed_by_a_custom_resource_after_its_permission(
    template: Template, stack: StallwatchStack
) -> None:
    [resource] = template.find_resources(CUSTOM_RESOURCE_TYPE).values()
    assert resource["Properties"] == {
        "ServiceToken": _arn(logical_id(_subscriber(stack))),
        "LogGroupName": SAGEMAKER_LOG_GROUP,
        "FilterName": FILTER,
        "FilterPattern": PATTERN,
        "DestinationArn": _arn(logical_id(stack.watchdog.on_log_line)),
    }
    permissions = template.to_json()["Resources"]
    assert any(
        permissions[d]["Type"] == "AWS::Lambda::Permission"
        and permissions[d]["Properties"]["SourceArn"] == _group_arn(f"{SAGEMAKER_LOG_GROUP}:*")
        for d in resource["DependsOn"]
    )
    # And the stack never deletes the shared group (it is not a resource of the stack)
    groups = template.find_resources("AWS::Logs::LogGroup").values()
    assert SAGEMAKER_LOG_GROUP not in [g["Properties"].get("LogGroupName") for g in groups]


def test_the_custom_resources_function_may_only_manage_subscriptions_of_sagemakers_group(
    template: Template, stack: StallwatchStack
) -> None:
    role = logical_id(_subscriber(stack).role)
    statements = _role_statements(template, role)
    [subscribe] = [s for s in statements if s.get("Sid") == "SubscribeSageMakerLogGroup"]
    assert sorted(as_list(subscribe["Action"])) == sorted(SUBSCRIPTION_ACTIONS)
    assert subscribe["Resource"] == [_group_arn(SAGEMAKER_LOG_GROUP), _group_arn(f"{SAGEMAKER_LOG_GROUP}:*")]
    # And nothing else but its own log stream: no table, no secret, no stop
    others = [a for s in statements if s is not subscribe for a in as_list(s["Action"])]
    assert others
    assert all(a.startswith("logs:") and a not in SUBSCRIPTION_ACTIONS for a in others)


def test_on_log_line_decides_like_on_alarm_and_needs_no_alarm_or_subscription_rights(
    template: Template, stack: StallwatchStack
) -> None:
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "handlers.on_log_line.handler",
            "Timeout": ON_LOG_LINE_TIMEOUT_SECONDS,
            "DeadLetterConfig": Match.any_value(),
            "Environment": {"Variables": Match.object_like({"TABLE_NAME": Match.any_value()})},
        },
    )
    actions = {
        a for s in _role_statements(template, logical_id(stack.watchdog.on_log_line.role)) for a in as_list(s["Action"])
    }
    assert {"sagemaker:DescribeTrainingJob", "ec2:DescribeInstances", "logs:FilterLogEvents"} <= actions
    assert {"sagemaker:StopTrainingJob", "ec2:StopInstances", "scheduler:CreateSchedule"} <= actions
    assert not {a for a in actions if a.startswith("cloudwatch:") and a != "cloudwatch:GetMetricData"}
    assert not set(SUBSCRIPTION_ACTIONS) & actions
    # And its errors and throttles are watched like the other functions'
    assert stack.watchdog.on_log_line in stack.watchdog.functions


def test_subscriptions_switched_off_leave_no_filter_permission_or_custom_resource(tmp_path: Path) -> None:
    # Given a deployment that subscribes no group
    unsubscribed = {"platforms": {name: {"log_subscription": False} for name in ("sagemaker", "ec2", "slurm")}}
    _, [stack] = build_app(tmp_path, stallwatch=unsubscribed)
    template = Template.from_stack(stack)
    # Then on_log_line stays (idle), and nothing sends it lines
    assert not template.find_resources("AWS::Logs::SubscriptionFilter")
    assert not template.find_resources(CUSTOM_RESOURCE_TYPE)
    assert not [
        p
        for p in template.find_resources("AWS::Lambda::Permission").values()
        if p["Properties"]["Principal"] == "logs.amazonaws.com"
    ]
    assert stack.platforms["sagemaker"].subscriber is None  # type: ignore[attr-defined]
