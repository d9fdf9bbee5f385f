"""One synthesized Stallwatch app per test session (jsii start-up and synth cost seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, CfnResource
from aws_cdk.assertions import Template
from constructs import Construct

from stacks.application import add_stacks
from stacks.constants import BUNDLE_DEPENDENCIES_CONTEXT_KEY
from stacks.stallwatch_stack import StallwatchStack
from tests.fixtures.templates import share

REPO_ROOT = Path(__file__).resolve().parents[2]


CDK_JSON = REPO_ROOT / "cdk.json"


def cdk_json_context(cdk_json: Path = CDK_JSON) -> dict[str, Any]:
    """The context `cdk synth` passes: cdk.json's, offline (no dependency install)."""
    context = json.loads(cdk_json.read_text())["context"]
    return {**context, BUNDLE_DEPENDENCIES_CONTEXT_KEY: False}


def build_app(outdir: Path, cdk_json: Path = CDK_JSON, **context: Any) -> tuple[App, list[StallwatchStack]]:
    """An app as `app.py` builds it under `cdk synth -c KEY=VALUE...`: each `context` key replaces cdk.json's."""
    app = App(outdir=str(outdir), context={**cdk_json_context(cdk_json), **context})
    return app, add_stacks(app, project_file=cdk_json)


@pytest.fixture(scope="session")
def default_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[App, StallwatchStack]:
    """The default app, synthesized once; synth raises on any unacknowledged cdk-nag finding."""
    app, [stack] = build_app(tmp_path_factory.mktemp("cdk.out"))
    share(tmp_path_factory, "default", app.synth().get_stack_by_name(stack.stack_name).template)
    return app, stack


@pytest.fixture(scope="session")
def stack(default_app: tuple[App, StallwatchStack]) -> StallwatchStack:
    return default_app[1]


@pytest.fixture(scope="session")
def template(stack: StallwatchStack) -> Template:
    return Template.from_stack(stack)


# A team with a Slurm cluster: the default deployment, Slurm watched too (it is off until one is set up).
SLURM_WATCHED = {"platforms": {"slurm": {"monitor": True}}}


@pytest.fixture(scope="session")
def slurm_stack(tmp_path_factory: pytest.TempPathFactory) -> StallwatchStack:
    """The default deployment with `platforms.slurm.monitor`, synthesized once (synth raises on a nag finding)."""
    app, [stack] = build_app(tmp_path_factory.mktemp("cdk.out"), stallwatch=SLURM_WATCHED)
    share(tmp_path_factory, "slurm", app.synth().get_stack_by_name(stack.stack_name).template)
    return stack


@pytest.fixture(scope="session")
def slurm_template(slurm_stack: StallwatchStack) -> Template:
    return Template.from_stack(slurm_stack)


def iam_statements(template: Template) -> list[dict[str, Any]]:
    """Every statement of every identity policy in the template."""
    policies = template.find_resources("AWS::IAM::Policy")
    return [
        statement for policy in policies.values() for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def as_list(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]


def logical_id(construct: Construct) -> str:
    """The logical id of an L2 construct's CloudFormation resource."""
    resource = construct.node.default_child
    assert isinstance(resource, CfnResource)
    return resource.stack.get_logical_id(resource)
