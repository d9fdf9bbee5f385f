"""The fleet's goodput from its runs: sums by cause and group, goodput over the GPU-hours paid for, the team a run
counts under, and the runs whose badput cost most."""

from __future__ import annotations

import pytest

from stallwatch.core.fleet import NO_TEAM, RunRecord, fleet_goodput, fleet_label, team_of
from stallwatch.core.goodput import Category, JobSpan, Total, measure_goodput

HOUR = 3600.0


def _run(name: str, team: str, productive: float, stalls: float, dollars: bool = True, **fields) -> RunRecord:
    """A run of `productive` and `stalls` GPU-hours (at $4 a GPU-hour where `dollars`)."""
    price = (lambda h: 4.0 * h) if dollars else (lambda h: None)
    totals = {
        Category.PRODUCTIVE: Total(productive * HOUR / 8, productive, price(productive)),
        Category.STALLS: Total(stalls * HOUR / 8, stalls, price(stalls)),
    }
    base = {"platform": "ec2", "instance_type": "p5.48xlarge", "started": 0.0, "ended": HOUR, "wall_s": HOUR}
    return RunRecord(name, team=team, jobs=1, totals=totals, **(base | fields))


def test_the_team_is_the_stallwatch_tag_else_the_accounts_own() -> None:
    assert team_of({"stallwatch:team": "vision", "team": "ignored"}) == "vision"
    assert team_of({"team": " research "}) == "research"
    assert team_of({"stallwatch:team": " "}) == NO_TEAM
    assert fleet_label({"ml.p4d.24xlarge": 2, "ml.c5.4xlarge": 1}) == "ml.c5.4xlarge+ml.p4d.24xlarge"


def test_the_fleet_sums_its_runs_by_cause_and_group_and_its_goodput_is_over_gpu_hours() -> None:
    runs = [
        _run("a", "vision", productive=80, stalls=20),
        _run("b", "vision", productive=10, stalls=90, platform="slurm"),
        _run("c", "nlp", productive=100, stalls=0, instance_type="p4d.24xlarge"),
    ]
    fleet = fleet_goodput(runs)
    assert fleet.totals[Category.STALLS].gpu_hours == pytest.approx(110)
    assert fleet.ratio == pytest.approx(190 / 300)  # not the mean of the runs' ratios (0.8, 0.1, 1.0)
    assert fleet.groups["team"]["vision"].runs == 2
    assert fleet.groups["team"]["vision"].ratio == pytest.approx(90 / 200)
    assert fleet.groups["platform"]["slurm"].badput.dollars == pytest.approx(360)
    assert set(fleet.groups["instance_type"]) == {"p5.48xlarge", "p4d.24xlarge"}
    assert [r.run for r in fleet.costliest(2)] == ["b", "a"]
    assert runs[1].top_cause is Category.STALLS
    assert runs[2].top_cause is None


def test_runs_without_a_price_are_ranked_by_gpu_hours() -> None:
    fleet = fleet_goodput([_run("cheap", "t", 1, 5), _run("unpriced", "t", 1, 50, dollars=False)])
    assert [r.run for r in fleet.costliest(5)] == ["unpriced", "cheap"]


def test_a_record_is_the_runs_goodput_where_it_ran_and_reads_back_as_written() -> None:
    spans = [
        JobSpan("llm", "p5.48xlarge", 2, created=0.0, ended=2 * HOUR, stall=(HOUR, 2 * HOUR)),
        JobSpan("llm-r1", "p5.48xlarge", 4, created=3 * HOUR, ended=4 * HOUR),
    ]
    goodput = measure_goodput("llm", spans)
    record = RunRecord.of(goodput, spans, "sagemaker", {"stallwatch:team": "vision"})
    assert (record.run, record.team, record.instance_type, record.jobs) == ("llm", "vision", "p5.48xlarge", 2)
    assert (record.started, record.ended) == (0.0, 4 * HOUR)
    assert record.gpu_hours == pytest.approx(goodput.gpu_hours)
    assert RunRecord.of_json(record.as_json()) == record
