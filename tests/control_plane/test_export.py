"""export-trace on moto: a SageMaker job's facts, metrics and logs become a trace the replay can read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import moto  # imported before any boto3 client is created
import pytest

from stallwatch import contract
from stallwatch.aws_source import AwsClients
from stallwatch.cli import EXIT_OK, EXIT_USAGE, main
from stallwatch.export import ExportError, export_trace
from stallwatch.replay import replay
from stallwatch.trace import EndEvent, LogEvent, MetricEvent, StatusEvent, load_trace

JOB = "gpt-neox-20b"
HORIZON_S = 900.0


@pytest.fixture
def clients() -> Iterator[AwsClients]:
    with moto.mock_aws():
        yield AwsClients(region="us-east-1")


def create_job(clients: AwsClients) -> float:
    """A 2-host p4d job tagged for enforce; returns its creation time (epoch seconds)."""
    clients.sagemaker.create_training_job(
        TrainingJobName=JOB,
        AlgorithmSpecification={
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1",
            "TrainingInputMode": "File",
        },
        RoleArn="arn:aws:iam::123456789012:role/sagemaker",
        OutputDataConfig={"S3OutputPath": "s3://bucket/out"},
        ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": 86_400},
        Tags=[{"Key": "stallwatch:mode", "Value": "enforce"}],
    )
    return clients.sagemaker.describe_training_job(TrainingJobName=JOB)["CreationTime"].timestamp()


def put_history(clients: AwsClients, created: float) -> None:
    """Ten minutes of host GPU metrics and agent Steps, and a log line per host."""
    for minute in range(1, 11):
        at = datetime.fromtimestamp(created + 60 * minute, UTC)
        data = [
            {
                "MetricName": "GPUUtilization",
                "Dimensions": [{"Name": "Host", "Value": f"{JOB}/algo-{host}"}],
                "Timestamp": at,
                "Value": 776.0,
            }
            for host in (1, 2)
        ]
        clients.cloudwatch.put_metric_data(Namespace=contract.SAGEMAKER_NAMESPACE, MetricData=data)
        clients.cloudwatch.put_metric_data(
            Namespace=contract.NAMESPACE,
            MetricData=[
                {
                    "MetricName": "Steps",
                    "Dimensions": [{"Name": "JobName", "Value": JOB}],
                    "Timestamp": at,
                    "Value": 30.0,
                }
            ],
        )
    clients.logs.create_log_group(logGroupName=contract.SAGEMAKER_LOG_GROUP)
    for host in (1, 2):
        stream = f"{JOB}/algo-{host}-{int(created)}"
        clients.logs.create_log_stream(logGroupName=contract.SAGEMAKER_LOG_GROUP, logStreamName=stream)
        clients.logs.put_log_events(
            logGroupName=contract.SAGEMAKER_LOG_GROUP,
            logStreamName=stream,
            logEvents=[
                {
                    "timestamp": int((created + 120 + host) * 1000),
                    "message": f"[rank {8 * (host - 1)}] step 60 loss 2.1\n",
                }
            ],
        )


def test_export_writes_facts_metrics_logs_and_status_history(clients: AwsClients, tmp_path: Path) -> None:
    # Given a job with ten minutes of metrics and one log line per host
    created = create_job(clients)
    put_history(clients, created)
    out = tmp_path / f"{JOB}.jsonl"

    # When it is exported
    exported = export_trace(JOB, clients, out, until=created + HORIZON_S)

    # Then the file holds the job, its tags, per-host metrics, agent metrics, logs and status history
    trace = load_trace(out)
    assert trace.header == exported.header
    job = trace.job
    assert (job.instance_type, job.instance_count, job.gpus_per_host, job.vcpus_per_host) == (
        "ml.p4d.24xlarge",
        2,
        8,
        96,
    )
    assert job.tags == {"stallwatch:mode": "enforce"}
    metrics = [e.metric for e in trace.events if isinstance(e, MetricEvent)]
    gpu_hosts = {m.dimensions["Host"] for m in metrics if m.name == "GPUUtilization"}
    assert gpu_hosts == {f"{JOB}/algo-1", f"{JOB}/algo-2"}
    assert sum(m.value for m in metrics if m.name == "Steps") == 300.0
    logs = [e for e in trace.events if isinstance(e, LogEvent)]
    assert [(round(e.t), e.log.message) for e in logs] == [
        (121, "[rank 0] step 60 loss 2.1"),
        (122, "[rank 8] step 60 loss 2.1"),
    ]
    statuses = [e for e in trace.events if isinstance(e, StatusEvent)]
    assert statuses[0].secondary == "Starting"
    assert isinstance(trace.events[-1], EndEvent)
    assert [e.t for e in trace.events] == sorted(e.t for e in trace.events)


def test_an_exported_trace_replays(clients: AwsClients, tmp_path: Path) -> None:
    # Given an exported job (moto reports it Completed)
    created = create_job(clients)
    put_history(clients, created)
    trace = export_trace(JOB, clients, tmp_path / "t.jsonl", until=created + HORIZON_S)

    # When replayed
    result = replay(trace)

    # Then it replays without a label, and nothing is stopped
    assert result.verdict is None
    assert result.first_stop_s is None


def test_export_of_an_unknown_job_names_it(clients: AwsClients) -> None:
    with pytest.raises(ExportError, match="training job 'nope'"):
        export_trace("nope", clients)


def test_cli_export_trace_writes_the_file(
    clients: AwsClients, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a job (moto: completed at creation, so the trace is its status history)
    create_job(clients)
    out = tmp_path / "cli.jsonl"

    # When exported from the command line
    code = main(["export-trace", JOB, "--region", "us-east-1", "--out", str(out)])

    # Then the trace is written and loads
    assert code == EXIT_OK
    assert load_trace(out).job.name == JOB
    assert f"wrote {out}" in capsys.readouterr().err


def test_cli_export_of_an_unknown_job_fails(clients: AwsClients, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export-trace", "nope"]) == EXIT_USAGE
    assert "training job 'nope'" in capsys.readouterr().err
