"""Builds the app's stacks from the validated configuration, with cdk-nag (AwsSolutions) checking them.

app = cdk.App()
add_stacks(app)
app.synth()  # fails on any unacknowledged cdk-nag finding
"""

from __future__ import annotations

import os

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import Node

from stacks.config_source import ConfigError, load_config
from stacks.constants import BUNDLE_DEPENDENCIES_CONTEXT_KEY, STACK_NAME
from stacks.stallwatch_stack import StallwatchStack


def add_stacks(app: App) -> list[StallwatchStack]:
    """One environment-agnostic stack, or one stack per region listed in `config.regions`."""
    config = load_config(app.node)
    bundle_dependencies = _bundle_dependencies(app.node)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    if not config.regions:
        return [StallwatchStack(app, STACK_NAME, config=config, bundle_dependencies=bundle_dependencies)]
    account = os.environ.get("CDK_DEFAULT_ACCOUNT")  # the CLI's current credentials; None leaves it to deploy time
    return [
        StallwatchStack(
            app,
            f"{STACK_NAME}-{region}",
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
