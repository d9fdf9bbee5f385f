"""The Slurm platform in the stack: deploy/slurm's events reach on_job_state, the Slurm log group is made and read, and
a deployment that watches Slurm alone grants what its functions need of it and no more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stallwatch.core.contract import SLURM_EVENT_DETAIL_TYPE, SLURM_EVENT_SOURCE

from .conftest import as_list, build_app, iam_statements


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


def test_slurm_job_events_reach_on_job_state(slurm_template: Template) -> None:
    template = slurm_template
    rules = [
        r["Properties"]["EventPattern"]
        for r in template.find_resources("AWS::Events::Rule").values()
        if SLURM_EVENT_SOURCE in (r["Properties"].get("EventPattern") or {}).get("source", [])
    ]
    assert rules == [{"source": [SLURM_EVENT_SOURCE], "detail-type": [SLURM_EVENT_DETAIL_TYPE]}]
    [target] = _rule_targets(template, SLURM_EVENT_SOURCE)
    assert target.startswith("WatchdogOnJobState")


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
    assert reads == {":log-group:/stallwatch/ec2/slurm:*"}
    assert [s for s in statements if _grants(s, "ec2:DescribeInstances")]  # the nodes' instances, by address
    answers = [s for s in statements if _grants(s, "ssm:ListCommandInvocations")]
    assert len(answers) == 1  # the sweeper reads the documents' answers
    assert answers[0]["Condition"] == {"StringEquals": {"aws:RequestedRegion": {"Ref": "AWS::Region"}}}
    forbidden = (
        "ec2:StopInstances",
        "sagemaker:StopTrainingJob",
        "ec2:StartInstances",
        "autoscaling:SetInstanceHealth",
    )
    assert not [s for s in statements for action in forbidden if _grants(s, action)]
    assert _rule_targets(slurm_only, "aws.sagemaker") == _rule_targets(slurm_only, "aws.ec2") == []


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
