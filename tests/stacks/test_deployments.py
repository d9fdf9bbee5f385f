"""Two deployments in one account and region: the deployment name sets the stack, the dashboards and the alarm
prefix, so nothing the two create shares a name, and both pass cdk-nag."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from aws_cdk import App, Validations
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from stacks.application import add_deployment
from stacks.config_source import load_config
from stacks.constants import DEPLOYMENT_TAG
from stacks.stallwatch_stack import StallwatchStack
from stallwatch.core.contract import CONTROL_PLANE_NAMESPACE

from .conftest import CDK_JSON, as_list, cdk_json_context, iam_statements, logical_id

DEPLOYMENTS = ("stallwatch", "team-b")
# Properties that give a resource a name unique in the account and region (or, for dashboards, the account).
PHYSICAL_NAMES = ("DashboardName", "AlarmName", "TableName", "FunctionName", "TopicName", "QueueName", "Name")


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StallwatchStack]:
    """The default deployment and `team-b`, from the same cdk.json, in one app, synthesized with cdk-nag."""
    app = App(outdir=str(tmp_path_factory.mktemp("cdk.out")), context=cdk_json_context())
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stacks = {}
    for name in DEPLOYMENTS:
        config = load_config(app.node, deployment=name, project_file=CDK_JSON)
        [stacks[name]] = add_deployment(app, name, config, bundle_dependencies=False)
    app.synth()  # raises on any unacknowledged cdk-nag finding
    return stacks


def _resolved(value: object) -> str | None:
    """A name given in the template as a string, CloudFormation tokens (e.g. the region) replaced by a placeholder;
    None for a reference to another resource (a name that resource chose)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(part if isinstance(part, str) else "TOKEN" for part in value["Fn::Join"][1])
    return None


def test_each_deployment_has_its_own_stack_dashboards_and_alarm_prefix(
    deployments: dict[str, StallwatchStack],
) -> None:
    for name, stack in deployments.items():
        template = Template.from_stack(stack)
        # Then the stack, its dashboards and its alarm prefix carry the deployment's name
        assert stack.stack_name == name
        assert stack.config.alarm_prefix == f"{name}-"
        dashboards = {
            _resolved(d["Properties"]["DashboardName"])
            for d in template.find_resources("AWS::CloudWatch::Dashboard").values()
        }
        assert dashboards == {f"{name}-fleet-TOKEN", f"{name}-job-TOKEN"}
        # And its roles may only write, and its alarms only invoke, under its own prefix
        alarm_writes = [s for s in iam_statements(template) if "cloudwatch:PutMetricAlarm" in as_list(s["Action"])]
        assert alarm_writes
        assert all(_resolved(s["Resource"]).endswith(f":alarm:{name}-*") for s in alarm_writes)
        [permission] = [
            p
            for p in template.find_resources("AWS::Lambda::Permission").values()
            if p["Properties"]["Principal"] == "lambda.alarms.cloudwatch.amazonaws.com"
        ]
        assert _resolved(permission["Properties"]["SourceArn"]).endswith(f":alarm:{name}-*")
        # And every resource is tagged with it
        functions = template.find_resources("AWS::Lambda::Function").values()
        assert all({"Key": DEPLOYMENT_TAG, "Value": name} in f["Properties"]["Tags"] for f in functions)


def test_no_name_is_shared_between_the_two_deployments(deployments: dict[str, StallwatchStack]) -> None:
    names: Counter[str] = Counter()
    for stack in deployments.values():
        for resource in Template.from_stack(stack).to_json()["Resources"].values():
            for key in PHYSICAL_NAMES:
                name = _resolved(resource.get("Properties", {}).get(key))
                if name is not None:
                    names[f"{resource['Type']} {name}"] += 1
    assert names, "no named resource found"
    assert [name for name, count in names.items() if count > 1] == []
    assert len({stack.stack_name for stack in deployments.values()}) == len(DEPLOYMENTS)


def test_the_outputs_link_each_deployments_own_dashboards(deployments: dict[str, StallwatchStack]) -> None:
    for name, stack in deployments.items():
        outputs = Template.from_stack(stack).find_outputs("*")
        for output, dashboard in (
            ("FleetDashboardUrl", stack.dashboards.fleet),
            ("JobDashboardUrl", stack.dashboards.job),
        ):
            assert outputs[output]["Value"]["Fn::Join"][1][-1] == {"Ref": logical_id(dashboard)}
        assert outputs["AlarmPrefix"]["Value"] == f"{name}-"


def test_the_synthesized_templates_are_one_per_deployment(deployments: dict[str, StallwatchStack]) -> None:
    outdir = Path(next(iter(deployments.values())).node.root.outdir)  # type: ignore[attr-defined]
    assert {p.name for p in outdir.glob("*.template.json")} == {f"{name}.template.json" for name in DEPLOYMENTS}


def test_each_deployment_alarms_on_its_own_health_metrics(deployments: dict[str, StallwatchStack]) -> None:
    for name, stack in deployments.items():
        template = Template.from_stack(stack)
        # Then every function publishes its health metrics under the deployment's name (Powertools' service)
        functions = template.find_resources("AWS::Lambda::Function").values()
        services = {f["Properties"]["Environment"]["Variables"].get("POWERTOOLS_SERVICE_NAME") for f in functions}
        assert services == {name}
        # And its failed-stop, Slack, resume, recheck and press alarms read only those, each named under its prefix
        health = [
            a["Properties"]
            for a in template.find_resources("AWS::CloudWatch::Alarm").values()
            if a["Properties"].get("Namespace") == CONTROL_PLANE_NAMESPACE
        ]
        assert len(health) == 5
        assert all(a["AlarmName"].startswith(f"{name}-health-") for a in health)
        assert all(a["Dimensions"] == [{"Name": "service", "Value": name}] for a in health)
        # And the fleet dashboard's control-plane graph searches only its own
        fleet = template.find_resources("AWS::CloudWatch::Dashboard")[logical_id(stack.dashboards.fleet)]
        body = json.dumps(fleet["Properties"]["DashboardBody"]).replace("\\", "")
        assert re.search(rf'ControlPlane"?,service}} service="{name}"', body)
