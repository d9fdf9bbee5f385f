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

from stacks.application import add_stacks
from stacks.config_source import ConfigError, load_config

from .conftest import REPO_ROOT, build_app


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
        ({"stallwatch": {"unknown": 1}}, "stallwatch.unknown: Extra inputs are not permitted"),
        ({"stallwatch": "{not json"}, "context 'stallwatch': not valid JSON"),
        ({"stallwatch:config-file": "/nonexistent/stallwatch.json"}, "stallwatch:config-file: cannot read"),
        ({"stallwatch:bundle-dependencies": "maybe"}, "stallwatch:bundle-dependencies: expected true or false"),
    ],
)
def test_a_bad_value_fails_with_the_field_named(context: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        add_stacks(App(context=context))


def test_regions_give_one_stack_per_region_each_cdk_nag_clean(tmp_path: Path) -> None:
    app, stacks = build_app(tmp_path, stallwatch={"regions": ["us-east-1", "eu-west-1"]})
    app.synth()  # raises on an unacknowledged finding: region-pinned ARNs must match the acknowledgements
    assert [(s.stack_name, s.region) for s in stacks] == [
        ("Stallwatch-us-east-1", "us-east-1"),
        ("Stallwatch-eu-west-1", "eu-west-1"),
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
