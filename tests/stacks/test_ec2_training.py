"""The EC2 training nodes' side of the stack: the log group with retention, the CloudWatch agent's configuration in
SSM, the trainer-agent wheel as an S3 asset, and a policy scoped to exactly those (deploy/ec2 uses them)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from aws_cdk.assertions import Match, Template

import trainer_agent
from stacks.constants import CLOUDWATCH_AGENT_CONFIG, INSTANCE_STREAMS
from stacks.stallwatch_stack import StallwatchStack
from tests.stacks.conftest import as_list, build_app

AGENT_CONFIG = json.loads(CLOUDWATCH_AGENT_CONFIG.read_text())


def _policy_statement(template: Template, sid: str) -> dict[str, Any]:
    [policy] = [
        p
        for p in template.find_resources("AWS::IAM::ManagedPolicy").values()
        if p["Properties"]["Description"].startswith("Stallwatch on EC2 training instances")
    ]
    return next(s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Sid"] == sid)


def test_the_stack_creates_the_ec2_log_group_with_retention_and_keeps_it(template: Template) -> None:
    template.has_resource(
        "AWS::Logs::LogGroup",
        {
            "Properties": {"LogGroupName": "/stallwatch/ec2", "RetentionInDays": 30},
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
        },
    )


def test_the_agent_configuration_is_an_ssm_parameter_the_nodes_may_read(template: Template) -> None:
    # Given the default deployment
    [(logical_id, parameter)] = template.find_resources("AWS::SSM::Parameter").items()
    properties = parameter["Properties"]

    # Then it is deploy/ec2/cloudwatch-agent.json, shipping to the stack's group, under the agent's naming convention
    assert properties["Name"] == "AmazonCloudWatch-stallwatch-ec2"
    assert json.loads(properties["Value"]) == AGENT_CONFIG
    # And the instance policy reads that parameter only
    read = _policy_statement(template, "ReadAgentConfig")
    assert as_list(read["Action"]) == ["ssm:GetParameter"]
    assert logical_id in json.dumps(read["Resource"])
    template.has_output("Ec2AgentConfigParameter", {"Value": {"Ref": logical_id}})


def test_the_wheel_is_an_asset_holding_the_agent_wheel_the_nodes_may_read(stack: StallwatchStack) -> None:
    # Given the synthesized asset of the wheel (its folder in the cloud assembly is named by its hash)
    folder = Path(stack.node.root.outdir) / f"asset.{stack.ec2_training.wheel.asset_hash}"

    # Then it holds exactly the agent's wheel, at the package's version, with the agent inside
    [wheel] = folder.iterdir()
    assert wheel.name == f"trainer_agent-{trainer_agent.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        assert "trainer_agent/agent.py" in archive.namelist()
    # And the instance policy may read that one object, and nothing else of the bucket
    template = Template.from_stack(stack)
    read = _policy_statement(template, "ReadAgentWheel")
    assert as_list(read["Action"]) == ["s3:GetObject"]
    assert read["Resource"]["Fn::Join"][1][-1] == f"/{stack.ec2_training.wheel.asset_hash}.zip"
    template.has_output("AgentWheelUri", {"Value": Match.any_value()})


def test_a_second_deployment_gets_a_log_group_and_parameter_of_its_own(tmp_path: Path) -> None:
    # Given a second deployment named team-b, with nothing else configured
    _, [stack] = build_app(tmp_path / "out", **{"stallwatch:deployment": "team-b"})
    template = Template.from_stack(stack)

    # Then its names do not collide with the default deployment's (both are created by name)
    template.has_resource_properties("AWS::Logs::LogGroup", {"LogGroupName": "/team-b/ec2"})
    template.has_resource_properties("AWS::SSM::Parameter", {"Name": "AmazonCloudWatch-team-b-ec2"})
    assert stack.config.ec2_log_group == "/team-b/ec2"  # and the functions read that group


def test_the_agent_names_every_stream_it_writes_as_the_policy_lets_it(template: Template) -> None:
    # Given the CloudWatch agent's configuration the nodes fetch, and the streams the instance policy lets them write
    streams = [c["log_stream_name"] for c in AGENT_CONFIG["logs"]["logs_collected"]["files"]["collect_list"]]
    ship = _policy_statement(template, "ShipTrainingLogs")

    # Then every stream is named by the instance's id (i-..., the agent's {instance_id}), which the policy requires
    assert streams
    assert all(name.startswith("{instance_id}") for name in streams)
    assert {r["Fn::Join"][1][-1].rsplit(":", 1)[-1] for r in as_list(ship["Resource"])} == {INSTANCE_STREAMS}
    assert sorted(as_list(ship["Action"])) == ["logs:CreateLogStream", "logs:PutLogEvents"]
