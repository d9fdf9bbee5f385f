"""Progress of long CLI work: shown on a terminal (stderr), never when the output is piped or with --json."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import moto  # imported before any boto3 client is created
import pytest

from stallwatch.aws.clients import AwsClients
from stallwatch.offline import cli
from stallwatch.offline.progress import WorkProgress
from tests.offline.test_export import JOB, create_job, put_history
from tests.offline.test_report import HOUR, RUN, TABLE, seed_known_run

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "traces"
TRACES = [str(CORPUS / name) for name in ("sm-idle-silent-1host.jsonl", "ec2-healthy-noagent.jsonl")]


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout and stderr taken for terminals (rich reads TTY_COMPATIBLE), as when the CLI runs in one."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")


@pytest.fixture
def clients() -> Iterator[AwsClients]:
    with moto.mock_aws():
        yield AwsClients(region="us-east-1")


def test_a_replay_of_several_traces_shows_its_progress_on_a_terminal(
    terminal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["replay", *TRACES]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert "replaying" in captured.err
    assert "2/2" in captured.err
    assert "sm-idle-silent-1host" in captured.out  # the timelines are still printed


def test_with_json_no_progress_is_drawn_even_on_a_terminal(terminal: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", *TRACES, "--json"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert captured.err == ""
    assert len(captured.out.splitlines()) == 2  # one JSON object per trace, nothing else


def test_piped_output_gets_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", *TRACES]) == cli.EXIT_OK
    assert "replaying" not in capsys.readouterr().err


def test_an_export_on_a_terminal_counts_its_aws_calls(
    terminal: None, clients: AwsClients, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a job with ten minutes of metrics and logs
    put_history(clients, create_job(clients))

    # When it is exported on a terminal
    assert cli.main(["export-trace", JOB, "--out", str(tmp_path / "job.jsonl")]) == cli.EXIT_OK

    # Then the progress line named the export and counted its reads, by operation
    err = capsys.readouterr().err
    assert f"exporting {JOB}" in err
    assert "GetMetricData 1" in err


def test_aws_calls_are_counted_while_inside_and_not_after(clients: AwsClients) -> None:
    # Given a progress display (off the terminal: counting does not depend on drawing)
    progress = WorkProgress()
    assert not progress.shown

    # When clients of the session make calls inside and after the block
    with progress, progress.aws_calls(clients.session, "listing") as calls:
        clients.sagemaker.list_training_jobs()
        clients.sagemaker.list_training_jobs()
        clients.cloudwatch.list_metrics()
    clients.sagemaker.list_training_jobs()

    # Then only the calls inside were counted, by operation
    assert calls == {"ListTrainingJobs": 2, "ListMetrics": 1}


def test_a_report_on_a_terminal_counts_the_runs_reads_and_with_json_shows_none(
    terminal: None, clients: AwsClients, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a run of two attempts in AWS
    seed_known_run(clients, (int(time.time() // HOUR) - 3) * HOUR)

    # When it is reported on a terminal, Then the reads of its attempts are counted as they are made
    assert cli.main(["report", RUN, "--table", TABLE]) == 0
    err = capsys.readouterr().err
    assert f"reading the run of {RUN}" in err
    assert "DescribeTrainingJob 3" in err  # the two attempts, and the third name that is not one

    # And with --json, nothing but the JSON
    assert cli.main(["report", RUN, "--table", TABLE, "--json"]) == 0
    assert capsys.readouterr().err == ""
