"""Rechecks in the stack: the schedule group, the role Scheduler assumes (this account's group only; invoke on_alarm,
dead letters), and the deciding functions' environment and least-privilege grants."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Template

from stacks.rechecks import DEAD_LETTER_ENV, GROUP_ENV, ROLE_ENV
from stacks.stallwatch_stack import StallwatchStack
from stallwatch.runtime.environment import LambdaEnvironment

from .conftest import as_list, iam_statements, logical_id

SCHEDULER = "scheduler.amazonaws.com"


def _arn(construct: Any) -> dict[str, Any]:
    return {"Fn::GetAtt": [logical_id(construct), "Arn"]}


def _group_id(template: Template) -> str:
    [group_id] = template.find_resources("AWS::Scheduler::ScheduleGroup")
    return group_id


def test_the_schedule_group_is_the_deployments_and_goes_with_the_stack(template: Template) -> None:
    groups = template.find_resources("AWS::Scheduler::ScheduleGroup")
    [group] = groups.values()
    assert group["Properties"]["Name"] == "stallwatch-rechecks"
    assert group["DeletionPolicy"] == "Delete"


def test_scheduler_assumes_its_role_only_for_this_accounts_group(template: Template, stack: StallwatchStack) -> None:
    role = template.find_resources("AWS::IAM::Role")[logical_id(stack.rechecks.role)]
    [trust] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": SCHEDULER}
    assert trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"] == {
        "StringEquals": {
            "aws:SourceAccount": {"Ref": "AWS::AccountId"},
            "aws:SourceArn": {"Fn::GetAtt": [_group_id(template), "Arn"]},
        }
    }


def test_schedulers_role_may_invoke_on_alarm_and_send_dead_letters_and_nothing_else(
    template: Template, stack: StallwatchStack
) -> None:
    role_id = logical_id(stack.rechecks.role)
    policies = [
        p for p in template.find_resources("AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
    ]
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]
    granted = sorted((s["Action"], str(s["Resource"])) for s in statements)
    assert granted == sorted(
        [
            ("lambda:InvokeFunction", str(_arn(stack.watchdog.on_alarm))),
            ("sqs:SendMessage", str(_arn(stack.watchdog.dead_letter_queue))),
        ]
    )


def test_the_deciding_functions_know_the_group_the_role_and_the_dead_letters(
    template: Template, stack: StallwatchStack
) -> None:
    functions = template.find_resources("AWS::Lambda::Function")
    expected = {
        GROUP_ENV: "stallwatch-rechecks",  # the group's name (the role, which the functions refer to, needs the group)
        ROLE_ENV: _arn(stack.rechecks.role),
        DEAD_LETTER_ENV: _arn(stack.watchdog.dead_letter_queue),
    }
    for function in (stack.watchdog.on_alarm, stack.watchdog.sweeper, stack.watchdog.on_log_line):
        env = functions[logical_id(function)]["Properties"]["Environment"]["Variables"]
        assert {name: env.get(name) for name in expected} == expected
    for function in (stack.watchdog.on_job_state, stack.slack_endpoint.function):
        env = functions[logical_id(function)]["Properties"]["Environment"]["Variables"]
        assert not set(expected) & set(env)
    # And these are the names the runtime reads its environment by
    aliases = {field.alias for field in LambdaEnvironment.model_fields.values()}
    assert set(expected) <= aliases


def test_only_the_deciding_functions_schedule_and_only_in_the_recheck_group(
    template: Template, stack: StallwatchStack
) -> None:
    # Given every identity policy's statements, by the role they are attached to
    by_role: dict[str, list[dict[str, Any]]] = {}
    for policy in template.find_resources("AWS::IAM::Policy").values():
        for role in policy["Properties"]["Roles"]:
            by_role.setdefault(role["Ref"], []).extend(policy["Properties"]["PolicyDocument"]["Statement"])
    scheduling = {
        role: [s for s in statements if any(a.startswith("scheduler:") for a in as_list(s["Action"]))]
        for role, statements in by_role.items()
    }
    deciders = {logical_id(function.role) for function in stack.watchdog.deciders}

    # Then on_alarm's, the sweeper's and on_log_line's roles, and no other, may create, update and delete schedules, in
    # the group only
    assert {role for role, statements in scheduling.items() if statements} == deciders
    for role in deciders:
        [statement] = scheduling[role]
        assert sorted(as_list(statement["Action"])) == [
            "scheduler:CreateSchedule",
            "scheduler:DeleteSchedule",
            "scheduler:UpdateSchedule",
        ]
        assert statement["Resource"]["Fn::Join"][1][-1] == ":schedule/stallwatch-rechecks/*"
        [passes] = [
            s for s in by_role[role] if s["Action"] == "iam:PassRole" and s["Resource"] == _arn(stack.rechecks.role)
        ]
        assert passes["Condition"] == {"StringEquals": {"iam:PassedToService": SCHEDULER}}


def test_no_grant_names_a_schedule_group_other_than_the_deployments(template: Template) -> None:
    resources = [
        str(r)
        for s in iam_statements(template)
        if any(a.startswith("scheduler:") for a in as_list(s["Action"]))
        for r in as_list(s["Resource"])
    ]
    assert resources
    assert all("schedule/stallwatch-rechecks/" in r for r in resources)
