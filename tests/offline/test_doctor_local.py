"""`stallwatch doctor --local`: the doctor's checks against the local demo's deployment on moto, from a checkout
after `make setup`, pass; and it says what it needs where there is no checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.offline import cli, doctor

pytestmark = pytest.mark.slow


def test_doctor_local_passes_on_the_demos_deployment_with_its_test_alert(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    # When a newcomer runs the doctor against the local deployment, with the test alert
    code = cli.main(["doctor", "--local", "--send-test-alert"])
    out = capfd.readouterr().out
    lines = out.splitlines()

    # Then every check passes, as against AWS, and only the doctor's report is printed
    assert code == 0, out
    assert lines[-1].endswith("checks passed")
    assert not [line for line in lines if line.lstrip().startswith("FAIL")]
    for name in ("function on_alarm", "table", "Slack answers", "sweeper runs", "test alert"):
        assert any(line.lstrip().startswith(f"ok  {name}:") for line in lines), name
    assert any("IAM on_alarm sagemaker:StopTrainingJob (no tag): implicitDeny" in line for line in lines)
    assert not [line for line in lines if line.startswith("{")]  # the functions' log lines are kept aside


def test_doctor_local_outside_a_checkout_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "LOCAL_CHECKOUT", tmp_path)
    assert cli.main(["doctor", "--local"]) == cli.EXIT_USAGE
    assert "--local needs a checkout of Stallwatch" in capsys.readouterr().err
