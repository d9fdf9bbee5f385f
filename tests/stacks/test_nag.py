"""cdk-nag (AwsSolutions) checks every synth: no unacknowledged finding, and every acknowledgement has a reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_sqs as sqs

from .conftest import build_app


@pytest.fixture(scope="module")
def aws_solutions_report(default_app: tuple[App, Stack]) -> dict[str, Any]:
    report = json.loads((Path(default_app[0].outdir) / "validation-report.json").read_text())
    [plugin] = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    return plugin


def test_the_default_app_has_no_unacknowledged_finding(aws_solutions_report: dict[str, Any]) -> None:
    assert aws_solutions_report["conclusion"] == "success"
    assert aws_solutions_report["violations"] == []


def test_every_acknowledged_finding_carries_a_reason(aws_solutions_report: dict[str, Any]) -> None:
    acknowledged = aws_solutions_report["suppressedViolations"]
    assert acknowledged
    for finding in acknowledged:
        assert len(finding["reason"]) > 40, finding["ruleName"]


def test_an_unacknowledged_finding_fails_synth(tmp_path: Path) -> None:
    # Given the app with one more, non-compliant resource (a queue that accepts plain HTTP)
    app, [stack] = build_app(tmp_path)
    sqs.Queue(stack, "Careless", encryption=sqs.QueueEncryption.SQS_MANAGED)
    # When it is synthesized, then cdk-nag stops it
    with pytest.raises(RuntimeError, match="AwsSolutions-SQS4"):
        app.synth()
