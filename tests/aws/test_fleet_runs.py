"""A run's goodput as the fleet dashboard gets it: one EMF line per category that held GPU time, its GPU-hours by
category alone and with platform, team and instance type, in the control plane's namespace."""

from __future__ import annotations

import json

import pytest

from stallwatch.aws.fleet_runs import publish
from stallwatch.core import contract
from stallwatch.core.fleet import RunRecord
from stallwatch.core.goodput import Category, Total

RUN = RunRecord(
    "llm-70b",
    "ec2",
    "vision",
    "p5.48xlarge",
    0.0,
    7200.0,
    7200.0,
    2,
    {Category.PRODUCTIVE: Total(5400, 12.0, 1180.0), Category.STALLS: Total(1800, 4.0, 393.0), Category.OTHER: Total()},
)


def test_a_runs_end_publishes_its_gpu_hours_per_category_with_every_dimension_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    publish(RUN, 7200.0)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line[contract.DIM_CATEGORY]: line[contract.RUN_GPU_HOURS] for line in lines} == {
        "productive": 12.0,
        "stalls": 4.0,
    }
    [directive] = lines[0]["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == contract.CONTROL_PLANE_NAMESPACE
    assert directive["Dimensions"] == [
        ["Category", "service"],
        ["Category", "Platform", "service"],
        ["Category", "Team", "service"],
        ["Category", "InstanceType", "service"],
    ]
    assert (lines[0]["Platform"], lines[0]["Team"], lines[0]["InstanceType"]) == ("ec2", "vision", "p5.48xlarge")
    assert lines[0]["_aws"]["Timestamp"] == 7_200_000


def test_nothing_is_printed_where_metrics_are_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    publish(RUN, 7200.0)
    assert capsys.readouterr().out == ""
