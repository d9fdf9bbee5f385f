#!/usr/bin/env python3
"""The Stallwatch CDK app: `npx cdk synth`, `npx cdk deploy` (docs/deploy.md)."""

from __future__ import annotations

import sys
from pathlib import Path

# The stacks validate the configuration with the runtime's own schema (stallwatch.core.config, stallwatch.core.policy).
sys.path.insert(0, str(Path(__file__).resolve().parent / "lambdas"))

from aws_cdk import App

from stacks.application import add_stacks
from stacks.config_source import ConfigError

# Read here too: `-c stallwatch='{...}'` replaces cdk.json's object in the context; the app merges it back in.
CDK_JSON = Path(__file__).resolve().parent / "cdk.json"


def main() -> None:
    app = App()
    try:
        add_stacks(app, project_file=CDK_JSON)
    except ConfigError as exc:
        sys.exit(f"stallwatch: {exc}")
    app.synth()


if __name__ == "__main__":
    main()
