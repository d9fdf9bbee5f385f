"""`stallwatch report JOB` on moto: a run whose split of time is known (a hang stopped by Stallwatch, a restart from
the checkpoint, redone steps), read back from SageMaker, CloudWatch and the audit trail."""

from __future__ import annotations

import json
from collections.abc import Iterator

import moto  # imported before any boto3 client is created
import pytest

from localrun import moto_sagemaker
from localrun.moto_world import World
from localrun.resources import create_table
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.goodput import run_spans
from stallwatch.aws.job_states import JobStates, StoredState
from stallwatch.aws.store import Store, job_key
from stallwatch.core.decision import JobState
from stallwatch.core.goodput import Category, measure_goodput
from stallwatch.core.pricing import instance_spec
from stallwatch.offline import cli

TABLE = "stallwatch-report"
RUN = "llama-8b"
HOUR = 3600.0
WHY = "7 ranks in all_reduce (train.py:212, seq 88421); rank 3 on algo-1 in loader.py:88 `next(it)`, seq 88420"

moto_sagemaker.install()


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def clients() -> Iterator[AwsClients]:
    with moto.mock_aws():
        yield AwsClients()


def seed_known_run(clients: AwsClients, t0: float) -> Store:
    """The run of tests/core/test_goodput.py, on moto from `t0`: llama-8b (hang stopped at +3600, Stopped at
    +4000) and llama-8b-r1 (created at +4300 from the checkpoint at step 300, Completed at +6000)."""
    world = World(clients, now=t0)
    create_table(clients.dynamodb, TABLE)
    store = Store(clients.dynamodb, TABLE, 30)
    chain = {"stallwatch:run": RUN, "stallwatch:resumed-from": RUN, "stallwatch:resume-attempt": "1"}
    for name, tags, created, training, ended, status in (
        (RUN, {}, 0, 300, 4000, "Stopped"),
        (f"{RUN}-r1", chain, 4300, 4600, 6000, "Completed"),
    ):
        world.create_job(name, hosts=1, tags=tags, training_since=t0 + created)  # created then, in moto
        moto_sagemaker.set_training_job_status(name, "InProgress", "Training", at=t0 + training)
        moto_sagemaker.set_training_job_status(name, status, status, at=t0 + ended)

    def windows(job: str, start: float, count: int, first_step: float, steps: float, tflops: float | None) -> None:
        times = [t0 + start + 60 * k for k in range(count)]
        world.agent_job(job, "Steps", [(t, steps) for t in times])
        world.agent_job(job, "Step", [(t, first_step + steps * (k + 1)) for k, t in enumerate(times)])
        world.agent_job(job, "PhaseBudgetRemaining", [(t, 0.0) for t in times])
        if tflops is not None:
            world.agent_job(job, "TFLOPsPerGPU", [(t, tflops) for t in times])

    windows(RUN, 600, 30, 0, 10, 100.0)
    windows(RUN, 2400, 2, 300, 0, None)
    world.agent_job(RUN, "PhaseBudgetRemaining", [(t0 + 2400, 50.0), (t0 + 2460, 20.0)])  # a checkpoint
    windows(RUN, 2520, 6, 300, 10, 100.0)
    windows(RUN, 2880, 12, 360, 0, None)
    windows(f"{RUN}-r1", 4900, 11, 300, 10, 120.0)
    windows(f"{RUN}-r1", 5560, 7, 410, 0, None)
    # Stallwatch's stop of the hang: the engine's audit record, as decide_and_act commits it
    stop = {
        "at": t0 + 3600,
        "job": RUN,
        "action": "stop",
        "diagnosis": "hang",
        "evidence": {"agent": {"step": 360.0, "last_step_t": t0 + 2880}, "stacks": {"summary": WHY}},
    }
    key = job_key("sagemaker", RUN)
    JobStates(store).commit(key, StoredState(), StoredState(JobState(stopped_at=t0 + 3600)), stop, t0 + 3600)
    return store


def test_the_report_of_a_known_run_read_back_from_aws(clients: AwsClients) -> None:
    # Given a run that hung, was stopped by Stallwatch and resumed from its checkpoint, three hours ago
    t0 = (int(1_795_000_000 // HOUR) - 3) * HOUR
    store = seed_known_run(clients, t0)

    # When its goodput is measured, starting from the resumed job
    run, spans = run_spans(clients, store, f"{RUN}-r1", now=t0 + 3 * HOUR, period=60)
    goodput = measure_goodput(run, spans)

    # Then the whole run is measured, and its time splits as it was made
    assert (run, goodput.jobs) == (RUN, (RUN, f"{RUN}-r1"))
    seconds = {c.value: round(t.seconds) for c, t in goodput.totals.items()}
    assert seconds == {
        "productive": 2460,
        "redone": 360,
        "startup": 1200,
        "phases": 120,
        "stalls": 720,
        "restart_gaps": 700,
        "other": 440,
    }
    assert goodput.ratio == pytest.approx(2460 / 6000)
    assert goodput.mean_tflops_per_gpu == pytest.approx((36 * 100 + 11 * 120) / 47)
    assert (goodput.stalls_caught, goodput.restarts, goodput.redone_steps) == (1, 1, 60)
    assert goodput.totals[Category.STALLS].gpu_hours == pytest.approx(720 * 8 / HOUR)


def test_stallwatch_report_prints_the_table_and_json(
    clients: AwsClients, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    t0 = (int(time.time() // HOUR) - 3) * HOUR
    seed_known_run(clients, t0)

    assert cli.main(["report", RUN, "--table", TABLE, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == [RUN, f"{RUN}-r1"]
    assert report["categories"]["stalls"]["seconds"] == pytest.approx(720)
    assert report["goodput"] == pytest.approx(0.41)
    assert report["stalls"] == [{"job": RUN, "why": WHY}]

    assert cli.main(["report", f"{RUN}-r1", "--table", TABLE]) == 0
    table = capsys.readouterr().out
    assert "Goodput of run llama-8b (llama-8b, llama-8b-r1)" in table
    assert "stalls (onset to stop)" in table
    assert "goodput 41.0%" in table
    assert "stalls caught 1" in table
    assert f"why {RUN} stalled: {WHY}" in table


def test_an_unknown_job_is_a_clear_error(clients: AwsClients, capsys: pytest.CaptureFixture[str]) -> None:
    create_table(clients.dynamodb, TABLE)
    assert cli.main(["report", "no-such-job", "--table", TABLE]) == cli.EXIT_USAGE
    assert "no-such-job" in capsys.readouterr().err


def test_the_report_takes_only_the_jobs_of_its_run(clients: AwsClients) -> None:
    # Given a run whose resume's name is held by a job of another run (or one a person created under that name)
    t0 = (int(1_795_000_000 // HOUR) - 3) * HOUR
    world = World(clients, now=t0)
    other = {"stallwatch:run": "someone-else", "stallwatch:resumed-from": "someone-else"}
    for name, tags in ((RUN, {}), (f"{RUN}-r1", other), (f"{RUN}-r2", {"stallwatch:run": RUN})):
        world.create_job(name, hosts=1, tags=tags, training_since=t0)
        moto_sagemaker.set_training_job_status(name, "Completed", "Completed", at=t0 + HOUR)

    # When the run's goodput is read
    run, spans = run_spans(clients, None, RUN, now=t0 + 2 * HOUR, period=60)

    # Then only its own first job is in it: the chain ends at a job that is not the run's
    assert (run, [span.name for span in spans]) == (RUN, [RUN])


@pytest.mark.parametrize("job", ["", "bad name", "nul\x00job", "\u00e9t\u00e9-job", "x" * 64])
def test_a_job_name_no_platform_allows_is_a_one_line_error(
    clients: AwsClients, capsys: pytest.CaptureFixture[str], job: str
) -> None:
    # When the report is asked for a name neither SageMaker nor EC2 allows
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["report", job, "--table", TABLE])

    # Then it exits with a usage error of one line, naming the argument, and nothing was asked of AWS
    err = capsys.readouterr().err
    assert exit_info.value.code == cli.EXIT_USAGE
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("stallwatch report: ")
    assert "JOB" in err


def test_an_aws_error_of_several_lines_prints_as_one(
    clients: AwsClients, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a request botocore refuses with its two-line "Parameter validation failed" text
    from botocore.exceptions import ParamValidationError

    def refuse(*_: object, **__: object) -> None:
        raise ParamValidationError(report="Invalid length for parameter TrainingJobName, value: 0, valid min length: 1")

    monkeypatch.setattr("stallwatch.aws.goodput.run_spans", refuse)

    # When the report runs into it, Then the error is one line
    assert cli.main(["report", RUN, "--table", TABLE]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Invalid length for parameter TrainingJobName" in err


def test_a_heterogeneous_sagemaker_job_is_priced_per_instance_group(clients: AwsClients) -> None:
    # Given a job of two instance groups (ResourceConfig.InstanceGroups has no InstanceType), ended after an hour
    t0 = (int(1_795_000_000 // HOUR) - 3) * HOUR
    world = World(clients, now=t0)
    groups = [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "small", "InstanceType": "ml.g5.12xlarge", "InstanceCount": 1},
    ]
    world.create_job("hetero", groups=groups, training_since=t0)
    moto_sagemaker.set_training_job_status("hetero", "Completed", "Completed", at=t0 + HOUR)

    # When it is measured
    goodput = measure_goodput(*run_spans(clients, None, "hetero", now=t0 + 2 * HOUR, period=60))

    # Then each group's instances count at their own type's price and devices
    p4d, g5 = instance_spec("ml.p4d.24xlarge"), instance_spec("ml.g5.12xlarge")
    assert goodput.gpu_hours == pytest.approx(2 * p4d.devices + g5.devices)
    assert goodput.dollars == pytest.approx(2 * p4d.usd_per_hour + g5.usd_per_hour)
