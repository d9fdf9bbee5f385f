"""The synthesized template passes cfn-lint."""

from __future__ import annotations

import json

from aws_cdk.assertions import Template
from cfnlint.api import ManualArgs, lint

# Regions where GPU training runs most; the template is environment-agnostic.
LINT_REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]
# CDK makes each function DependsOn its role as well as GetAtt it (so the role's policy exists first): harmless.
IGNORED = ["W3005"]


def test_the_template_passes_cfn_lint(template: Template) -> None:
    matches = lint(json.dumps(template.to_json()), config=ManualArgs(regions=LINT_REGIONS, ignore_checks=IGNORED))
    assert [str(match) for match in matches] == []
