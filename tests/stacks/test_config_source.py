"""The deployment's config: cdk.json context and/or a file, validated; a bad value names its field."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from stacks.application import add_stacks
from stacks.config_source import ConfigError, deployment_name, load_config

from .conftest import REPO_ROOT, build_app, cdk_json_context

SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:stallwatch/slack-AbCdEf"


def test_context_overrides_the_file_field_by_field(tmp_path: Path) -> None:
    # Given a file with thresholds and a context that overrides one of them
    config_file = tmp_path / "stallwatch.json"
    config_file.write_text(json.dumps({"policy": {"mode": "enforce", "thresholds": {"stall_minutes": 30}}}))
    app = App(
        context={
            "stallwatch:config-file": str(config_file),
            "stallwatch": {"policy": {"thresholds": {"idle_minutes": 15}}, "sweeper_minutes": 10},
        }
    )
    # When the config is loaded
    config = load_config(app.node)
    # Then both sources count
    assert config.policy.mode == "enforce"
    assert config.policy.thresholds.stall_minutes == 30
    assert config.policy.thresholds.idle_minutes == 15
    assert config.sweeper_minutes == 10


def test_context_given_on_the_command_line_is_json() -> None:
    app = App(context={"stallwatch": '{"alarm_prefix": "team-a-"}'})
    assert load_config(app.node).alarm_prefix == "team-a-"


@pytest.mark.parametrize(
    ("context", "message"),
    [
        (
            {"stallwatch": {"policy": {"thresholds": {"stall_minutes": 0}}}},
            "stallwatch.policy.thresholds.stall_minutes: Input should be greater than 0",
        ),
        ({"stallwatch": {"policy": {"mode": "loud"}}}, "stallwatch.policy.mode: Input should be"),
        ({"stallwatch": {"sweeper_minutes": 0}}, "stallwatch.sweeper_minutes: Input should be greater than or equal"),
        ({"stallwatch": {"regions": ["mars-1"]}}, "stallwatch.regions: Value error, not an AWS region: 'mars-1'"),
        (
            {"stallwatch": {"slack": {"reserved_concurrency": 1}}},
            "stallwatch.slack.reserved_concurrency: Input should be greater than or equal to 2",
        ),
        (
            {"stallwatch": {"slack": {"reserved_concurrency": 900}}},
            "stallwatch.slack.reserved_concurrency: Input should be less than or equal to 100",
        ),
        ({"stallwatch": {"unknown": 1}}, "stallwatch.unknown: Extra inputs are not permitted"),
        (
            {"stallwatch": {"platforms": {"slurm": {"monitor": "maybe"}}}},
            "stallwatch.platforms.slurm.monitor: Input should be a valid boolean",
        ),
        ({"stallwatch": {"platforms": {"k8s": {}}}}, "stallwatch.platforms.k8s: Extra inputs are not permitted"),
        ({"stallwatch": {"policy": {"monitor_slurm": "maybe"}}}, "policy.monitor_slurm: expected true or false"),
        ({"stallwatch": "{not json"}, "context 'stallwatch': not valid JSON"),
        ({"stallwatch:config-file": "/nonexistent/stallwatch.json"}, "stallwatch:config-file: cannot read"),
        ({"stallwatch:bundle-dependencies": "maybe"}, "stallwatch:bundle-dependencies: expected true or false"),
        ({"stallwatch:deployment": "team_b"}, "stallwatch:deployment: expected letters, digits and inner hyphens"),
        ({"stallwatch:deployment": "team-"}, "got 'team-'"),
    ],
)
def test_a_bad_value_fails_with_the_field_named(context: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        add_stacks(App(context=context))


# What the adopter's cdk.json held when `-c stallwatch=` used to replace it whole.
ADOPTER_CONFIG = {
    "policy": {"mode": "notify", "thresholds": {"stall_minutes": 30}},
    "slack": {"secret_arn": SECRET_ARN, "allowed_user_ids": ["U012ABCDEF"]},
    "alarm_prefix": "ml-",
    "notification_emails": ["oncall@example.com"],
}


def _cdk_json(folder: Path, config: dict[str, object]) -> Path:
    """A copy of the repository's cdk.json (app, feature flags) with `config` as its `stallwatch` object."""
    project = json.loads((REPO_ROOT / "cdk.json").read_text())
    project["context"]["stallwatch"] = config
    path = folder / "cdk.json"
    path.write_text(json.dumps(project))
    return path


def test_the_command_line_merges_into_cdk_json_field_by_field(tmp_path: Path) -> None:
    # Given cdk.json with a full config, and `-c stallwatch='{"policy": {"mode": "observe"}}'` (the CLI's string)
    cdk_json = _cdk_json(tmp_path, ADOPTER_CONFIG)
    # When the app is built
    _, [stack] = build_app(tmp_path / "out", cdk_json, stallwatch='{"policy": {"mode": "observe"}}')
    # Then only the mode changed: prefix, allow-list, e-mails, threshold and secret ARN are kept
    config = stack.config
    assert config.policy.mode == "observe"
    assert config.policy.thresholds.stall_minutes == 30
    assert (config.alarm_prefix, config.slack.allowed_user_ids) == ("ml-", ["U012ABCDEF"])
    assert config.notification_emails == ["oncall@example.com"]
    assert config.slack.secret_arn == SECRET_ARN
    # And the stack imports that secret instead of creating a new, empty one
    assert Template.from_stack(stack).find_resources("AWS::SecretsManager::Secret") == {}


def test_cdk_json_then_the_config_file_then_the_command_line(tmp_path: Path) -> None:
    # Given cdk.json, a config file over it, and the command line over both
    cdk_json = _cdk_json(tmp_path, ADOPTER_CONFIG)
    config_file = tmp_path / "prod.json"
    config_file.write_text(json.dumps({"policy": {"mode": "enforce", "thresholds": {"idle_minutes": 45}}}))
    file_only = {**cdk_json_context(cdk_json), "stallwatch:config-file": str(config_file)}
    command_line = {**file_only, "stallwatch": {"policy": {"thresholds": {"idle_minutes": 15}}}}
    # When each is loaded
    from_file = load_config(App(context=file_only).node, project_file=cdk_json)
    from_command_line = load_config(App(context=command_line).node, project_file=cdk_json)
    # Then the file beats cdk.json, the command line beats the file, and the rest of cdk.json stays
    assert (from_file.policy.mode, from_file.policy.thresholds.idle_minutes) == ("enforce", 45)
    assert (from_command_line.policy.mode, from_command_line.policy.thresholds.idle_minutes) == ("enforce", 15)
    for config in (from_file, from_command_line):
        assert (config.policy.thresholds.stall_minutes, config.alarm_prefix) == (30, "ml-")


def test_the_alarm_prefix_follows_the_deployment_name_unless_set() -> None:
    named = App(context={"stallwatch:deployment": "team-b"})
    assert load_config(named.node, deployment=deployment_name(named.node)).alarm_prefix == "team-b-"
    assert load_config(App().node).alarm_prefix == "stallwatch-"
    explicit = App(context={"stallwatch": {"alarm_prefix": "sw-"}})
    assert load_config(explicit.node, deployment="team-b").alarm_prefix == "sw-"


def test_regions_give_one_stack_per_region_each_cdk_nag_clean(tmp_path: Path) -> None:
    app, stacks = build_app(tmp_path, stallwatch={"regions": ["us-east-1", "eu-west-1"]})
    app.synth()  # raises on an unacknowledged finding: region-pinned ARNs must match the acknowledgements
    assert [(s.stack_name, s.region) for s in stacks] == [
        ("stallwatch-us-east-1", "us-east-1"),
        ("stallwatch-eu-west-1", "eu-west-1"),
    ]


def test_synth_of_the_app_fails_on_a_bad_value_and_names_the_field() -> None:
    # Given the context the CDK CLI would pass, with a bad threshold
    context = {"stallwatch": {"policy": {"thresholds": {"stall_minutes": -1}}}}
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    # When app.py runs
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    # Then it fails, naming the field
    assert result.returncode != 0
    assert "stallwatch.policy.thresholds.stall_minutes: Input should be greater than 0" in result.stderr
