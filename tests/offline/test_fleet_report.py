"""`stallwatch report --fleet` over a corpus of runs: the corpus's SageMaker traces played onto moto as the runs they
were (`localrun.trace_run`: each job, its agent windows, Stallwatch's stop where the replay stops it), ended through the
real on_job_state handler (which records each run's goodput), then the fleet's goodput printed, as JSON, and drawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handlers import on_job_state
from localrun.moto_world import TABLE, job_state_event
from localrun.trace_run import play_trace
from stallwatch.core.fleet import NO_TEAM
from stallwatch.core.trace import Trace
from stallwatch.offline import cli
from stallwatch.offline.trace_file import load_trace
from tests.fixtures.moto_runtime import aws_env, context, rt, slack  # noqa: F401

TRACES = Path(__file__).resolve().parents[2] / "corpus" / "traces"
# The runs: a trace, and the team its job is tagged with (None: no team tag).
RUNS = {
    "sm-hang-8host-agent.jsonl": {"stallwatch:team": "pretraining"},
    "sm-crashed-rank-8host.jsonl": {"stallwatch:team": "pretraining"},
    "sm-healthy-8host-agent.jsonl": {"team": "vision"},  # an account's own team tag is taken too
    "sm-hetero-hang-agent.jsonl": {"stallwatch:team": "vision"},
    "sm-long-download-1host.jsonl": {},
}
HOUR = 3600.0


pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")


def _tagged(trace: Trace, tags: dict[str, str]) -> Trace:
    job = trace.job.model_copy(update={"tags": {**trace.job.tags, **tags}})
    return Trace(trace.header.model_copy(update={"job": job}), trace.events, trace.source)


@pytest.fixture
def fleet(rt, context) -> dict[str, dict[str, str]]:  # noqa: F811 - the fixtures imported above
    """The runs played onto moto over the last days, each ended through on_job_state; job -> its tags."""
    played = {}
    start = (rt.clock() - 4 * 86_400) // 60 * 60
    for index, (name, tags) in enumerate(RUNS.items()):
        trace = _tagged(load_trace(TRACES / name), tags)
        job = play_trace(rt.clients, rt.store, trace, epoch=start + index * 12 * HOUR)
        status = rt.clients.sagemaker.describe_training_job(TrainingJobName=job)["TrainingJobStatus"]
        ended = on_job_state.handler(job_state_event(job, status, tags=trace.job.tags), context)
        assert ended["goodput"]["status"] == "recorded", ended
        again = on_job_state.handler(job_state_event(job, status, tags=trace.job.tags), context)
        assert again["goodput"]["status"] == "duplicate"  # a repeated end event records the run once
        played[job] = trace.job.tags
    return played


def _report(capsys, *args: str) -> str:
    assert cli.main(["report", *args, "--table", TABLE]) == 0
    return capsys.readouterr().out


def test_the_fleet_is_the_sum_of_its_runs_by_cause_platform_instance_type_and_team(fleet, capsys) -> None:
    # Given each run's own report
    runs = {job: json.loads(_report(capsys, job, "--json")) for job in fleet}

    # When the fleet's goodput is reported as JSON
    report = json.loads(_report(capsys, "--fleet", "--since", "30d", "--json"))

    # Then it holds every run, and each category's GPU-hours are the runs' sum
    assert report["runs"] == len(RUNS)
    for category, total in report["totals"].items():
        expected = sum(r["categories"].get(category, {}).get("gpu_hours", 0.0) for r in runs.values())
        assert total["gpu_hours"] == pytest.approx(expected), category
    productive = sum(r["categories"]["productive"]["gpu_hours"] for r in runs.values())
    assert report["goodput"] == pytest.approx(productive / sum(r["gpu_hours"] for r in runs.values()))

    # And by team (the stallwatch:team tag, else the team tag), platform and instance type
    teams = report["by"]["team"]
    assert {team: group["runs"] for team, group in teams.items()} == {"pretraining": 2, "vision": 2, NO_TEAM: 1}
    pretraining = [job for job, tags in fleet.items() if tags.get("stallwatch:team") == "pretraining"]
    assert teams["pretraining"]["gpu_hours"] == pytest.approx(sum(runs[job]["gpu_hours"] for job in pretraining))
    assert {p: g["runs"] for p, g in report["by"]["platform"].items()} == {"sagemaker": len(RUNS)}
    types = {instance_type: group["runs"] for instance_type, group in report["by"]["instance_type"].items()}
    assert types == {"ml.p4d.24xlarge": 4, "ml.p5.48xlarge": 1}

    # And the costliest runs first: by badput dollars, the stopped hangs and crashes ahead of the healthy run
    costly = [run["run"] for run in report["costliest"]]
    badput = {run: runs[run]["dollars"] - runs[run]["categories"]["productive"]["dollars"] for run in runs}
    assert costly == sorted(badput, key=lambda run: -badput[run])


def test_the_fleet_report_prints_its_tables_and_draws_its_chart(fleet, capsys, tmp_path: Path) -> None:
    chart = tmp_path / "fleet.png"
    out = _report(capsys, "--fleet", "--since", "30d", "--plot", str(chart))
    assert f"({len(RUNS)} runs ended, 0 running)" in out
    for title in ("By platform", "By instance type", "By team", "runs whose badput cost most"):
        assert title in out
    assert "stalls (onset to stop)" in out
    assert chart.stat().st_size > 10_000
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_window_that_ends_before_the_runs_holds_none_and_bad_arguments_are_refused(fleet, capsys) -> None:
    report = json.loads(_report(capsys, "--fleet", "--since", "1h", "--json"))
    assert report["runs"] == 0
    assert cli.main(["report", "--table", TABLE]) == cli.EXIT_USAGE
    assert cli.main(["report", "llama", "--fleet", "--table", TABLE]) == cli.EXIT_USAGE
    assert "name a JOB, or ask for --fleet" in capsys.readouterr().err
