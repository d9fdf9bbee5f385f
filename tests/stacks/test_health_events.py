"""AWS Health's EC2 scheduled events in the stack: the rule takes those events only, to the health-event function,
whose own role reads the jobs and their logs and touches only its table items: it stops, restarts and sends nothing
(the moves are the sweeper's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk.assertions import Match, Template

from stacks.stallwatch_stack import StallwatchStack
from stallwatch.core.contract import HEALTH_EVENT_DETAIL_TYPE, HEALTH_EVENT_SOURCE

from .conftest import as_list, build_app, logical_id


def _role_statements(template: Template, stack: StallwatchStack) -> list[dict[str, Any]]:
    role = logical_id(stack.host_events.role)
    policies = template.find_resources("AWS::IAM::Policy")
    return [
        statement
        for policy in policies.values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_rule_sends_ec2_scheduled_changes_to_the_function_with_retries_and_a_dead_letter_queue(
    template: Template, stack: StallwatchStack
) -> None:
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": [HEALTH_EVENT_SOURCE],
                "detail-type": [HEALTH_EVENT_DETAIL_TYPE],
                "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]},
            },
            "Targets": [
                Match.object_like(
                    {
                        "Arn": {"Fn::GetAtt": [logical_id(stack.host_events.function), "Arn"]},
                        "DeadLetterConfig": Match.any_value(),
                        "RetryPolicy": {"MaximumRetryAttempts": 2},
                    }
                )
            ],
        },
    )


def test_the_function_only_reads_jobs_and_logs_and_writes_its_own_items(
    template: Template, stack: StallwatchStack
) -> None:
    statements = _role_statements(template, stack)
    actions = {action for s in statements for action in as_list(s["Action"])}
    # Then nothing stops, starts, restarts or sends a command
    assert not [a for a in actions if a.startswith(("ssm:", "autoscaling:", "sagemaker:")) or "Stop" in a]
    assert {"ec2:DescribeInstances", "logs:FilterLogEvents", "logs:DescribeLogStreams"} <= actions
    [describe] = [s for s in statements if "ec2:DescribeInstances" in as_list(s["Action"])]
    assert "aws:RequestedRegion" in describe["Condition"]["StringEquals"]
    [table] = [s for s in statements if "dynamodb:PutItem" in as_list(s["Action"])]
    assert "dynamodb:DeleteItem" not in table["Action"]
    assert table["Condition"] == {
        "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["job#*", "host-move", "pending-post", "slurm-running"]}
    }


def test_a_deployment_watching_sagemaker_only_has_no_health_event_function(tmp_path: Path) -> None:
    _, [stack] = build_app(tmp_path, stallwatch={"platforms": {"ec2": {"monitor": False}}})
    handlers = {
        f["Properties"]["Handler"] for f in Template.from_stack(stack).find_resources("AWS::Lambda::Function").values()
    }
    assert "handlers.on_health_event.handler" not in handlers
