"""`stallwatch replay --mode`: a backtest with the deployment's own config replays the job in the mode it would be
watched in once tagged, so a notify deployment's config still shows the stops that opting the job in would allow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallwatch.offline import cli

HANG = Path(__file__).resolve().parents[2] / "corpus" / "traces" / "sm-hang-8host-agent.jsonl"


@pytest.fixture
def notify_config(tmp_path: Path) -> Path:
    """The default deployment's config file: notify, stops only of jobs tagged stallwatch:mode=enforce."""
    path = tmp_path / "prod.json"
    path.write_text(json.dumps({"policy": {"mode": "notify", "stop_requires_tag": True}}))
    return path


def _replayed(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = cli.main(["replay", str(HANG), "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_the_deployments_notify_config_alone_replays_a_hang_without_its_stop(
    notify_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, result = _replayed(capsys, "--policy", str(notify_config))
    assert result["mode"] == "notify"
    assert result["first_stop_s"] is None
    assert (code, result["verdict"]) == (cli.EXIT_FAILED, "fail")  # the trace is labeled: stopped


def test_mode_enforce_replays_the_job_as_if_tagged_and_shows_the_stop_the_tag_allows(
    notify_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, result = _replayed(capsys, "--policy", str(notify_config), "--mode", "enforce")
    assert result["mode"] == "enforce"
    assert result["first_stop_s"] is not None
    assert (code, result["verdict"]) == (cli.EXIT_OK, "pass")


def test_mode_observe_overrides_the_traces_own_tag(capsys: pytest.CaptureFixture[str]) -> None:
    code, result = _replayed(capsys, "--mode", "observe")
    assert result["mode"] == "observe"
    assert result["first_stop_s"] is None
    assert code == cli.EXIT_FAILED
