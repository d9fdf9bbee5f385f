"""`cdk synth` through the pinned CLI (package.json) works offline and warns of nothing: as operators and CI run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

CDK_CLI = REPO_ROOT / "node_modules" / ".bin" / "cdk"


@pytest.mark.slow
def test_cdk_synth_through_the_cli_works_offline(tmp_path: Path) -> None:
    # Given the CLI from package.json, this venv's python first on PATH, and no dependency download
    assert CDK_CLI.exists(), "node_modules missing: run `make setup` (npm install)"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
    }
    command = [str(CDK_CLI), "synth", "--quiet", "--no-notices", "-c", "stallwatch:bundle-dependencies=false"]
    # When it synthesizes the app
    result = subprocess.run(
        [*command, "--output", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # Then the default deployment's template is there, with its seven functions (the custom resource, on_health_event)
    assert result.returncode == 0, result.stderr[-4000:]
    template = json.loads((tmp_path / "stallwatch.template.json").read_text())
    functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert len(functions) == 7
    # And cdk.json sets every feature flag the pinned CLI recommends (`cdk init`): no unconfigured-flag warning
    assert "feature flags are not configured" not in result.stdout + result.stderr
