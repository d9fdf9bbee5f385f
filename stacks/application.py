"""Builds the app's stacks from the validated configuration, with cdk-nag (AwsSolutions) checking them.

app = cdk.App()
add_stacks(app, project_file=Path("cdk.json"))  # the deployment named by context `stallwatch:deployment`
app.synth()  # fails on any unacknowledged cdk-nag finding

Two deployments in one account and region differ by name (stack, dashboards, alarm prefix):
`npx cdk deploy -c stallwatch:deployment=team-b -c stallwatch:config-file=team-b.json`.
"""

from __future__ import annotations

import os
from pathlib import Path

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import Node

from stacks.config_source import ConfigError, deployment_name, load_config
from stacks.constants import BUNDLE_DEPENDENCIES_CONTEXT_KEY
from stacks.stallwatch_stack import StallwatchStack
from stallwatch.core.config import StallwatchConfig


def add_stacks(app: App, *, project_file: Path | None = None) -> list[StallwatchStack]:
    """The deployment the context names, configured from `project_file` (cdk.json) and the context, nag-checked."""
    name = deployment_name(app.node)
    config = load_config(app.node, deployment=name, project_file=project_file)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return add_deployment(app, name, config, bundle_dependencies=_bundle_dependencies(app.node))


def add_deployment(
    app: App, name: str, config: StallwatchConfig, *, bundle_dependencies: bool = True
) -> list[StallwatchStack]:
    """One environment-agnostic stack `name`, or one stack `name-<region>` per region in `config.regions`."""
    if not config.regions:
        return [StallwatchStack(app, name, deployment=name, config=config, bundle_dependencies=bundle_dependencies)]
    account = os.environ.get("CDK_DEFAULT_ACCOUNT")  # the CLI's current credentials; None leaves it to deploy time
    return [
        StallwatchStack(
            app,
            f"{name}-{region}",
            deployment=name,
            config=config,
            bundle_dependencies=bundle_dependencies,
            env=Environment(account=account, region=region),
        )
        for region in config.regions
    ]


def _bundle_dependencies(node: Node) -> bool:
    value = node.try_get_context(BUNDLE_DEPENDENCIES_CONTEXT_KEY)
    if value is None:
        return True
    text = str(value).lower()  # cdk.json gives a bool, `-c stallwatch:bundle-dependencies=false` a string
    if text not in ("true", "false"):
        raise ConfigError(f"{BUNDLE_DEPENDENCIES_CONTEXT_KEY}: expected true or false, got {value!r}")
    return text == "true"
