"""The Slurm platform in the stack: deploy/slurm's events reach on_job_state from a bus only the controllers' role may
put on, HyperPod's node health events too, the Slurm log group is made and read, the controllers' policy lets the
runner read and answer only its commands, and a deployment that watches Slurm alone grants what its functions need of
it and no more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks.constants import INSTANCE_STREAMS
from stallwatch.core.contract import SLURM_EVENT_DETAIL_TYPE, SLURM_EVENT_SOURCE

from .conftest import as_list, build_app, iam_statements

SLURM_AGENT_CONFIG = Path(__file__).parents[2] / "deploy" / "slurm" / "cloudwatch-agent.json"


@pytest.fixture(scope="module")
def slurm_only(tmp_path_factory: pytest.TempPathFactory) -> Template:
    config = {"platforms": {"sagemaker": {"monitor": False}, "ec2": {"monitor": False}, "slurm": {"monitor": True}}}
    _, [stack] = build_app(Path(tmp_path_factory.mktemp("slurm-only")), stallwatch=config)
    return Template.from_stack(stack)


def _rule_targets(template: Template, source: str) -> list[str]:
    rules = template.find_resources("AWS::Events::Rule")
    return [
        t["Arn"]["Fn::GetAtt"][0]
        for r in rules.values()
        if source in (r["Properties"].get("EventPattern") or {}).get("source", [])
        for t in r["Properties"]["Targets"]
    ]


def test_slurm_job_events_reach_on_job_state_from_a_bus_only_the_controllers_may_put_on(
    slurm_template: Template,
) -> None:
    template = slurm_template
    # The rule listens on the stack's Slurm bus, not the default one
    [(rule, pattern)] = [
        (r["Properties"], r["Properties"]["EventPattern"])
        for r in template.find_resources("AWS::Events::Rule").values()
        if SLURM_EVENT_SOURCE in (r["Properties"].get("EventPattern") or {}).get("source", [])
    ]
    assert pattern == {"source": [SLURM_EVENT_SOURCE], "detail-type": [SLURM_EVENT_DETAIL_TYPE]}
    [bus] = template.find_resources("AWS::Events::EventBus")
    assert rule["EventBusName"] == {"Ref": bus}
    [target] = _rule_targets(template, SLURM_EVENT_SOURCE)
    assert target.startswith("WatchdogOnJobState")
    # Only a principal whose role is tagged stallwatch:slurm=controller may put events on it: any other is denied
    statements = [
        s
        for p in template.find_resources("AWS::Events::EventBusPolicy").values()
        for s in as_list(p["Properties"].get("Statement") or [])
    ] + [
        s
        for b in template.find_resources("AWS::Events::EventBus").values()
        for s in (b["Properties"].get("Policy") or {}).get("Statement", [])
    ]
    denies = [s for s in statements if s["Effect"] == "Deny"]
    assert [s["Condition"] for s in denies] == [
        {"StringNotEqualsIgnoreCase": {"aws:PrincipalTag/stallwatch:slurm": "controller"}}
    ]
    assert all(as_list(s["Action"]) == ["events:PutEvents"] for s in statements)
    assert "SlurmEventBusName" in template.find_outputs("*")


def test_the_controllers_policy_lets_the_runner_read_and_answer_only_its_commands(slurm_template: Template) -> None:
    template = slurm_template
    [policy] = [
        p["Properties"]
        for p in template.find_resources("AWS::IAM::ManagedPolicy").values()
        if "Slurm controller" in p["Properties"].get("Description", "")
    ]
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert set(statements) == {"PutSlurmJobEvents", "RunnerCommands"}
    runner = statements["RunnerCommands"]
    assert sorted(as_list(runner["Action"])) == ["dynamodb:Query", "dynamodb:UpdateItem"]
    assert runner["Condition"] == {
        "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["slurm-command#*", "slurm-runner"]}
    }
    assert statements["PutSlurmJobEvents"]["Condition"] == {"StringEquals": {"events:source": SLURM_EVENT_SOURCE}}


def test_hyperpod_node_health_events_reach_on_job_state(slurm_template: Template) -> None:
    template = slurm_template
    rules = [
        r["Properties"]
        for r in template.find_resources("AWS::Events::Rule").values()
        if "SageMaker HyperPod Cluster Node Health Event"
        in (r["Properties"].get("EventPattern") or {}).get("detail-type", [])
    ]
    assert [r["EventPattern"]["source"] for r in rules] == [["aws.sagemaker"]]
    assert rules[0]["Targets"][0]["Arn"]["Fn::GetAtt"][0].startswith("WatchdogOnJobState")


def test_the_slurm_log_group_is_made_under_the_ec2_group_and_named_as_an_output(slurm_template: Template) -> None:
    template = slurm_template
    groups = [g["Properties"].get("LogGroupName") for g in template.find_resources("AWS::Logs::LogGroup").values()]
    assert "/stallwatch/ec2/slurm" in groups  # the deployment's EC2 group is /stallwatch/ec2
    assert "SlurmLogGroup" in template.find_outputs("*")


def _grants(statement: dict[str, Any], action: str) -> bool:
    return statement["Effect"] == "Allow" and action in as_list(statement["Action"])


def test_a_slurm_only_deployment_grants_the_slurm_reads_and_nothing_of_the_other_platforms(
    slurm_only: Template,
) -> None:
    statements = iam_statements(slurm_only)
    reads = {
        r["Fn::Join"][1][-1] for s in statements if _grants(s, "logs:FilterLogEvents") for r in as_list(s["Resource"])
    }
    # the jobs' logs, and HyperPod's health agent in its clusters' groups
    assert reads == {":log-group:/stallwatch/ec2/slurm:*", ":log-group:/aws/sagemaker/Clusters/*"}
    assert [s for s in statements if _grants(s, "ec2:DescribeInstances")]  # the nodes' instances, by address
    hyperpod = [s for s in statements if _grants(s, "sagemaker:BatchReplaceClusterNodes")]
    assert hyperpod
    assert all(r["Fn::Join"][1][-1] == ":cluster/*" for s in hyperpod for r in as_list(s["Resource"]))
    forbidden = (
        "ec2:StopInstances",
        "sagemaker:StopTrainingJob",
        "ec2:StartInstances",
        "autoscaling:SetInstanceHealth",
        "ssm:SendCommand",
        "ssm:ListCommandInvocations",
    )
    assert not [s for s in statements for action in forbidden if _grants(s, action)]
    training_jobs = [
        r
        for r in slurm_only.find_resources("AWS::Events::Rule").values()
        if "SageMaker Training Job State Change" in (r["Properties"].get("EventPattern") or {}).get("detail-type", [])
    ]
    assert training_jobs == _rule_targets(slurm_only, "aws.ec2") == []


def test_a_team_without_slurm_gets_nothing_of_it_by_default(template: Template) -> None:
    # Given the default deployment (Slurm is off until a cluster is set up: `platforms.slurm.monitor`)
    resources = template.to_json()["Resources"]
    # Then no rule, document, log group, grant or output is Slurm's
    assert _rule_targets(template, SLURM_EVENT_SOURCE) == []
    assert not [k for k in resources if "Slurm" in k]
    assert not [s for s in iam_statements(template) if "Slurm" in s.get("Sid", "")]
    assert not [o for o in template.find_outputs("*") if "Slurm" in o]
    groups = [g["Properties"].get("LogGroupName") for g in template.find_resources("AWS::Logs::LogGroup").values()]
    assert "/stallwatch/ec2/slurm" not in groups


def test_last_releases_keys_still_synthesize_the_same_stack(slurm_template: Template, tmp_path: Path) -> None:
    # Given last release's config keys for Slurm (read for one release, with a warning)
    with pytest.warns(FutureWarning, match="write platforms.slurm.monitor"):
        _, [stack] = build_app(tmp_path, stallwatch={"policy": {"monitor_slurm": True}})
    # Then the stack is the one the new key makes
    old, new = Template.from_stack(stack).to_json()["Resources"], slurm_template.to_json()["Resources"]
    assert set(old) == set(new)
    assert {k: v for k, v in old.items() if v["Type"] == "AWS::IAM::Policy"} == {
        k: v for k, v in new.items() if v["Type"] == "AWS::IAM::Policy"
    }


def test_the_slurm_nodes_may_write_only_streams_named_by_an_instance_never_every_stream_of_the_group(
    slurm_only: Template,
) -> None:
    # Given the policies a Slurm deployment makes for the clusters' nodes and controllers (managed policies), and the
    # nodes' CloudWatch agent configuration
    policies = slurm_only.find_resources("AWS::IAM::ManagedPolicy").values()
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]
    writes = [s for s in statements if _grants(s, "logs:PutLogEvents") or _grants(s, "logs:CreateLogStream")]
    [collected] = json.loads(SLURM_AGENT_CONFIG.read_text())["logs"]["logs_collected"]["files"]["collect_list"]

    # Then no statement grants the Slurm group's every stream (the old ShipSlurmJobLogs): each names instance ids'
    # streams, and the agent names the nodes' streams by their instance id, as the policy requires
    assert writes
    assert "ShipSlurmJobLogs" not in {s.get("Sid") for s in writes}
    streams = {r["Fn::Join"][1][-1].rsplit(":log-group:", 1)[-1] for s in writes for r in as_list(s["Resource"])}
    assert streams == {
        f"/stallwatch/ec2:log-stream:{INSTANCE_STREAMS}",
        f"/stallwatch/ec2/*:log-stream:{INSTANCE_STREAMS}",
    }
    assert collected["log_stream_name"] == "{instance_id}"
