"""Least privilege: no `*` action, stops only on opted-in resources, alarm writes only on the prefix."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

from aws_cdk.assertions import Template

from stacks.platforms.ec2 import STOP_INSTANCES
from stacks.platforms.sagemaker import STOP_TRAINING_JOB
from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE

from .conftest import as_list, build_app, iam_statements

STOP_ACTIONS = (STOP_TRAINING_JOB, STOP_INSTANCES)
SAGEMAKER = "sagemaker.amazonaws.com"


def _grants(statement: dict[str, Any], action: str) -> bool:
    """Whether an Allow statement covers `action`, wildcards included (IAM actions are case-insensitive)."""
    return statement["Effect"] == "Allow" and any(
        fnmatch.fnmatch(action.lower(), pattern.lower()) for pattern in as_list(statement["Action"])
    )


def _requires_opt_in_tag(statement: dict[str, Any]) -> bool:
    condition = statement.get("Condition", {})
    key = f"aws:ResourceTag/{STOP_OPT_IN_TAG}"
    return any(
        condition.get(operator, {}).get(key) == STOP_OPT_IN_VALUE
        for operator in ("StringEquals", "StringEqualsIgnoreCase")
    )


def _passed_to(statement: dict[str, Any]) -> str | None:
    return statement.get("Condition", {}).get("StringEquals", {}).get("iam:PassedToService")


def test_roles_are_passed_only_to_sagemaker_for_resumes_and_to_scheduler_for_rechecks(template: Template) -> None:
    passes = [s for s in iam_statements(template) if _grants(s, "iam:PassRole")]
    assert {_passed_to(s) for s in passes} == {SAGEMAKER, "scheduler.amazonaws.com"}


def test_no_statement_has_a_wildcard_action(template: Template) -> None:
    for statement in iam_statements(template):
        for action in as_list(statement["Action"]):
            assert "*" not in action, statement


def test_every_stop_grant_requires_the_opt_in_tag(template: Template) -> None:
    for action in STOP_ACTIONS:
        grants = [s for s in iam_statements(template) if _grants(s, action)]
        assert grants, f"nobody may {action}"
        for statement in grants:
            assert _requires_opt_in_tag(statement), statement


def test_alarm_writes_are_scoped_to_the_prefix(template: Template) -> None:
    writes = [
        s
        for s in iam_statements(template)
        if _grants(s, "cloudwatch:PutMetricAlarm") or _grants(s, "cloudwatch:DeleteAlarms")
    ]
    assert writes
    for statement in writes:
        [resource] = as_list(statement["Resource"])
        assert resource["Fn::Join"][1][-1] == ":alarm:stallwatch-*", statement


def test_put_metric_data_is_limited_to_the_stallwatch_namespace(template: Template) -> None:
    [statement] = [s for s in iam_statements(template) if _grants(s, "cloudwatch:PutMetricData")]
    assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": "Stallwatch"}}


def test_without_stop_requires_tag_stops_are_unconditioned_and_only_enabled_platforms_are_granted(
    tmp_path: Path,
) -> None:
    # Given a policy that allows stopping any job and watches SageMaker only
    config = {
        "policy": {"stop_requires_tag": False},
        "platforms": {"ec2": {"monitor": False}},
        "alarm_prefix": "sw-",
    }
    # When the app is synthesized
    _, [stack] = build_app(tmp_path, stallwatch=config)
    statements = iam_statements(Template.from_stack(stack))
    # Then StopTrainingJob has no tag condition, and nothing touches EC2 (nor recovers EC2 jobs in place, nor runs a
    # Slurm document)
    stops = [s for s in statements if _grants(s, STOP_TRAINING_JOB)]
    assert stops
    assert all("Condition" not in s for s in stops)
    assert not [s for s in statements if any(a.startswith(("ec2:", "ssm:")) for a in as_list(s["Action"]))]
    assert not Template.from_stack(stack).find_resources("AWS::SSM::Document")
    alarm_writes = [s for s in statements if _grants(s, "cloudwatch:PutMetricAlarm")]
    assert all(s["Resource"]["Fn::Join"][1][-1] == ":alarm:sw-*" for s in alarm_writes)


def _managed_policy_statements(template: Template) -> list[dict[str, Any]]:
    [policy] = [
        p
        for p in template.find_resources("AWS::IAM::ManagedPolicy").values()
        if p["Properties"]["Description"].startswith("Stallwatch on EC2 training instances")
    ]
    return policy["Properties"]["PolicyDocument"]["Statement"]


def test_ec2_training_instances_get_a_managed_policy_with_its_arn_as_an_output(template: Template) -> None:
    # Given the default deployment
    statements = _managed_policy_statements(template)
    outputs = template.find_outputs("Ec2InstancePolicyArn")

    # Then the instance role may publish only the agent's and the CloudWatch agent's metrics (IAM has no condition
    # on their dimensions), ship logs only to the EC2 log group (and under it) without creating or configuring a
    # group, into streams named by an instance id (the Slurm nodes' too: their group is under the EC2 one), read the
    # agent's configuration and the wheel, and do nothing else; its ARN is an output
    metrics = next(s for s in statements if _grants(s, "cloudwatch:PutMetricData"))
    assert sorted(metrics["Condition"]["StringEquals"]["cloudwatch:namespace"]) == ["CWAgent", "Stallwatch"]
    writes = {
        r["Fn::Join"][1][-1]
        for s in statements
        if _grants(s, "logs:PutLogEvents") or _grants(s, "logs:CreateLogStream")
        for r in as_list(s["Resource"])
    }
    assert writes == {
        ":log-group:/stallwatch/ec2:log-stream:i-*",
        ":log-group:/stallwatch/ec2/*:log-stream:i-*",
    }
    lists = [r["Fn::Join"][1][-1] for s in statements if _grants(s, "logs:DescribeLogStreams") for r in s["Resource"]]
    assert sorted(lists) == [":log-group:/stallwatch/ec2/*:*", ":log-group:/stallwatch/ec2:*"]
    actions = {a for s in statements for a in as_list(s["Action"])}
    assert actions == {
        "cloudwatch:PutMetricData",
        "logs:CreateLogStream",
        "logs:DescribeLogStreams",
        "logs:PutLogEvents",
        "ssm:GetParameter",
        "s3:GetObject",
    }
    assert not any(_grants(s, action) for s in statements for action in STOP_ACTIONS)
    [output] = outputs.values()
    assert "Ref" in output["Value"]


def test_the_functions_read_ec2_training_logs_from_the_configured_group_only(
    template: Template, slurm_template: Template
) -> None:
    def reads(found: Template) -> set[str]:
        statements = [s for s in iam_statements(found) if _grants(s, "logs:FilterLogEvents")]
        return {r["Fn::Join"][1][-1] for s in statements for r in as_list(s["Resource"])}

    training = {
        ":log-group:/aws/sagemaker/TrainingJobs:*",
        ":log-group:/stallwatch/ec2:*",
        ":log-group:/stallwatch/ec2/*:*",
    }
    assert reads(template) == training
    # and, with Slurm, its jobs' group and HyperPod clusters' groups (their health agents' lines)
    slurm = {":log-group:/stallwatch/ec2/slurm:*", ":log-group:/aws/sagemaker/Clusters/*"}
    assert reads(slurm_template) == training | slurm


def test_logs_insights_queries_and_their_results_are_granted_on_the_training_log_group_only(template: Template) -> None:
    # The Service Authorization Reference gives GetQueryResults, like StartQuery, the log-group resource type
    for action in ("logs:StartQuery", "logs:GetQueryResults"):
        grants = [s for s in iam_statements(template) if _grants(s, action)]
        resources = [r for s in grants for r in as_list(s["Resource"])]
        assert resources, action
        assert all(r != "*" and r["Fn::Join"][1][-1] == ":log-group:/aws/sagemaker/TrainingJobs:*" for r in resources)


def test_resume_grants_are_tag_conditioned_and_pass_roles_only_to_sagemaker(template: Template) -> None:
    # on_job_state resumes and the sweeper retries: each role has the same grants, and no other
    creates = [s for s in iam_statements(template) if _grants(s, "sagemaker:CreateTrainingJob")]
    passes = [s for s in iam_statements(template) if _grants(s, "iam:PassRole") and _passed_to(s) == SAGEMAKER]
    starts = [s for s in iam_statements(template) if _grants(s, "ec2:StartInstances")]
    assert len(creates) == len(passes) == len(starts) == 2
    for create, passrole, start in zip(creates, passes, starts, strict=True):
        # CreateTrainingJob only of jobs that carry the resume chain's tag
        assert create["Condition"] == {"Null": {"aws:RequestTag/stallwatch:resumed-from": "false"}}
        assert _grants(create, "sagemaker:AddTags")
        # PassRole only to SageMaker, only of roles opted in with the resume tag
        assert passrole["Condition"] == {
            "StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"},
            "Null": {"aws:ResourceTag/stallwatch:resume": "false"},
        }
        assert passrole["Resource"]["Fn::Join"][1][-1] == ":role/*"
        # StartInstances only of instances tagged for resume
        assert start["Condition"] == {"Null": {"aws:ResourceTag/stallwatch:resume": "false"}}
