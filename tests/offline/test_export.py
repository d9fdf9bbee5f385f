"""export-trace on moto: a SageMaker job's or an EC2 instance's facts, metrics and logs become a trace to replay."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import moto  # imported before any boto3 client is created
import pytest

from stallwatch.aws.clients import AwsClients
from stallwatch.core import contract
from stallwatch.core.config import EC2_LOG_GROUP
from stallwatch.core.signals import Platform
from stallwatch.core.trace import EndEvent, LogEvent, MetricEvent, StatusEvent
from stallwatch.offline.cli import EXIT_OK, EXIT_USAGE, main
from stallwatch.offline.export import ExportError, export_trace, platform_of
from stallwatch.offline.replay import replay
from stallwatch.offline.trace_file import load_trace
from stallwatch.offline.trace_source import TraceSource

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


# EC2: a job is named by its instance id.
EC2_TAGS = {"stallwatch:monitor": "true", "stallwatch:mode": "enforce"}


def run_instance(clients: AwsClients) -> tuple[str, float]:
    """A tagged p4d instance; returns its id and LaunchTime (epoch seconds)."""
    instance = clients.ec2.run_instances(
        ImageId="ami-12345678",
        MinCount=1,
        MaxCount=1,
        InstanceType="p4d.24xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in EC2_TAGS.items()]}],
    )["Instances"][0]
    return instance["InstanceId"], instance["LaunchTime"].timestamp()


def put_ec2_history(clients: AwsClients, instance_id: str, launched: float) -> None:
    """Ten minutes of the CloudWatch agent's GPU metrics, EC2 CPU utilization and the agent's Steps."""
    by_instance = [{"Name": contract.CWAGENT_DIM_INSTANCE, "Value": instance_id}]
    for minute in range(1, 11):
        at = datetime.fromtimestamp(launched + 60 * minute, UTC)
        gpu = {contract.CWAGENT_GPU_UTILIZATION: 97.0, contract.CWAGENT_GPU_MEMORY_USED: 60_000.0}
        gpu[contract.CWAGENT_GPU_MEMORY_TOTAL] = 81_920.0
        clients.cloudwatch.put_metric_data(
            Namespace=contract.CWAGENT_NAMESPACE,
            MetricData=[
                {"MetricName": name, "Dimensions": by_instance, "Timestamp": at, "Value": value}
                for name, value in gpu.items()
            ],
        )
        clients.cloudwatch.put_metric_data(
            Namespace=contract.EC2_NAMESPACE,
            MetricData=[{"MetricName": "CPUUtilization", "Dimensions": by_instance, "Timestamp": at, "Value": 4.0}],
        )
        clients.cloudwatch.put_metric_data(
            Namespace=contract.NAMESPACE,
            MetricData=[
                {
                    "MetricName": "Steps",
                    "Dimensions": [{"Name": contract.DIM_JOB, "Value": instance_id}],
                    "Timestamp": at,
                    "Value": 30.0,
                }
            ],
        )


def test_an_instance_id_is_an_ec2_job() -> None:
    assert platform_of("i-0123456789abcdef0") is Platform.EC2
    assert platform_of("i-0123abcd") is Platform.EC2
    assert platform_of("i-love-llms") is Platform.SAGEMAKER  # a SageMaker job may start with "i-"
    assert platform_of(JOB) is Platform.SAGEMAKER


def test_export_of_an_instance_writes_facts_and_metrics(clients: AwsClients, tmp_path: Path) -> None:
    # Given a running, tagged instance with ten minutes of agent and EC2 metrics
    instance_id, launched = run_instance(clients)
    put_ec2_history(clients, instance_id, launched)
    out = tmp_path / f"{instance_id}.jsonl"

    # When it is exported by its instance id
    exported = export_trace(instance_id, clients, out, until=launched + HORIZON_S)

    # Then the header describes the instance as a one-host EC2 job named by its id
    trace = load_trace(out)
    assert trace.header == exported.header
    job = trace.job
    assert (job.name, job.platform, job.instance_type, job.instance_count) == (instance_id, "ec2", "p4d.24xlarge", 1)
    assert (job.gpus_per_host, job.vcpus_per_host, job.instance_ids) == (8, 96, [instance_id])
    assert job.tags == EC2_TAGS
    # And the events: InProgress at launch, the metrics as the control plane reads them, no logs
    assert trace.events[0] == StatusEvent(t=0.0, status="InProgress")
    metrics = [e.metric for e in trace.events if isinstance(e, MetricEvent)]
    seen = {(m.namespace, m.name, tuple(sorted(m.dimensions.items()))) for m in metrics}
    by_instance = ((contract.CWAGENT_DIM_INSTANCE, instance_id),)
    assert seen == {
        (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_UTILIZATION, by_instance),
        (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_USED, by_instance),
        (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_TOTAL, by_instance),
        (contract.EC2_NAMESPACE, "CPUUtilization", by_instance),
        (contract.NAMESPACE, "Steps", ((contract.DIM_JOB, instance_id),)),
    }
    assert sum(m.value for m in metrics if m.name == "Steps") == 300.0
    # one datapoint per 1-minute period, stamped at the period's start (t = seconds since LaunchTime)
    steps_at = [launched + e.t for e in trace.events if isinstance(e, MetricEvent) and e.metric.name == "Steps"]
    assert len(steps_at) == 10
    assert all(at % 60 == 0 for at in steps_at)
    assert not [e for e in trace.events if isinstance(e, LogEvent)]
    assert trace.events[-1] == EndEvent(t=HORIZON_S, end=True)


def test_an_exported_instance_replays_with_its_signals(clients: AwsClients, tmp_path: Path) -> None:
    # Given an exported, busy instance
    instance_id, launched = run_instance(clients)
    put_ec2_history(clients, instance_id, launched)
    export_trace(instance_id, clients, tmp_path / "ec2.jsonl", until=launched + HORIZON_S)
    trace = load_trace(tmp_path / "ec2.jsonl")

    # When replayed, and read as the replay reads it
    result = replay(trace)
    source = TraceSource(trace)
    signals = source.job_signals(instance_id, now=source.epoch(11 * 60))

    # Then the replay sees its GPU, GPU memory, CPU and progress, and stops nothing
    host = signals.hosts[instance_id]
    assert {v for _, v in host.gpu_util.points} == {97.0}
    assert {round(v, 1) for _, v in host.gpu_mem_util.points} == {73.2}
    assert {v for _, v in host.cpu_util.points} == {4.0}
    assert sum(v for _, v in signals.agent["Steps"].points) == 300.0
    assert result.verdict is None
    assert result.first_stop_s is None


def test_a_stopped_instance_ends_at_its_stop(clients: AwsClients, tmp_path: Path) -> None:
    # Given an instance that was stopped (moto stops it at once)
    instance_id, _ = run_instance(clients)
    clients.ec2.stop_instances(InstanceIds=[instance_id])

    # When it is exported without a horizon
    trace = export_trace(instance_id, clients, tmp_path / "stopped.jsonl")

    # Then the trace ends at the stop, with the status the control plane gives a stopped instance
    *_, stopped, end = trace.events
    assert stopped == StatusEvent(t=stopped.t, status="Stopped")
    assert end.t == stopped.t < 60


def test_export_of_an_unknown_instance_names_it(clients: AwsClients) -> None:
    with pytest.raises(ExportError, match="EC2 instance 'i-0123456789abcdef0'"):
        export_trace("i-0123456789abcdef0", clients)


def test_cli_export_trace_of_an_instance(
    clients: AwsClients, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a running instance
    instance_id, _ = run_instance(clients)
    out = tmp_path / "cli-ec2.jsonl"

    # When exported from the command line by its id, with the deployment's config
    code = main(["export-trace", instance_id, "--region", "us-east-1", "--out", str(out), *_config(tmp_path)])

    # Then the trace is an EC2 job's
    assert code == EXIT_OK
    assert load_trace(out).job.platform is Platform.EC2
    assert f"wrote {out}" in capsys.readouterr().err


def test_an_ec2_job_is_exported_by_its_job_tag_with_every_instance_and_its_logs(
    clients: AwsClients, tmp_path: Path
) -> None:
    # Given 2 instances tagged stallwatch:job=llm-70b (the agent's JobName), with metrics and a log stream each
    tags = [{"Key": "stallwatch:job", "Value": "llm-70b"}, {"Key": "stallwatch:mode", "Value": "enforce"}]
    launched = clients.ec2.run_instances(
        ImageId="ami-12345678",
        MinCount=2,
        MaxCount=2,
        InstanceType="p4d.24xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"]
    instances = sorted(i["InstanceId"] for i in launched)
    start = min(i["LaunchTime"].timestamp() for i in launched)
    clients.logs.create_log_group(logGroupName=EC2_LOG_GROUP)
    for instance_id in instances:
        put_ec2_history(clients, instance_id, start)
        clients.logs.create_log_stream(logGroupName=EC2_LOG_GROUP, logStreamName=instance_id)
        clients.logs.put_log_events(
            logGroupName=EC2_LOG_GROUP,
            logStreamName=instance_id,
            logEvents=[{"timestamp": int((start + 120) * 1000), "message": f"[{instance_id}] step 40 loss 2.1"}],
        )
    out = tmp_path / "llm-70b.jsonl"

    # When exported by the tag
    export_trace("llm-70b", clients, out, until=start + HORIZON_S, platform=Platform.EC2)

    # Then the trace is one EC2 job of both instances, with both streams' lines, and replays to the same hosts
    trace = load_trace(out)
    assert (trace.job.name, trace.job.instance_count, trace.job.instance_ids) == ("llm-70b", 2, instances)
    assert trace.job.tags == {t["Key"]: t["Value"] for t in tags}
    assert sorted(e.log.stream for e in trace.events if isinstance(e, LogEvent)) == instances
    signals = TraceSource(trace).job_signals("llm-70b", now=TraceSource(trace).epoch(11 * 60))
    assert sorted(signals.hosts) == instances
    assert all(signals.hosts[i].log_last_t is not None for i in instances)


def test_cli_export_of_an_ec2_job_tag_that_no_instance_carries_fails(
    clients: AwsClients, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["export-trace", "llm-70b", "--platform", "ec2", "--region", "us-east-1", *_config(tmp_path)])
    assert code == EXIT_USAGE
    assert "stallwatch:job='llm-70b'" in capsys.readouterr().err


def _config(folder: Path, **fields: object) -> list[str]:
    """--config with a deployment's config file holding `fields`."""
    path = folder / "deployment.json"
    path.write_text(json.dumps(fields))
    return ["--config", str(path)]


def test_cli_export_of_an_ec2_job_reads_the_log_group_of_the_deployment_it_names(
    clients: AwsClients, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a deployment whose EC2 log group is /team-b/ec2, and an instance that logged there
    instance_id, start = run_instance(clients)
    clients.logs.create_log_group(logGroupName="/team-b/ec2")
    clients.logs.create_log_stream(logGroupName="/team-b/ec2", logStreamName=instance_id)
    clients.logs.put_log_events(
        logGroupName="/team-b/ec2",
        logStreamName=instance_id,
        logEvents=[{"timestamp": int(max(start, time.time() - 1) * 1000), "message": "step 10 loss 2.3"}],
    )  # within the trace: an export ends now
    out = tmp_path / "team-b.jsonl"

    # When exported with that deployment's config, as the other commands take it
    argv = ["export-trace", instance_id, "--region", "us-east-1", "--out", str(out)]
    assert main([*argv, *_config(tmp_path, ec2_log_group="/team-b/ec2")]) == EXIT_OK

    # Then the trace holds the instance's log line from the deployment's group
    assert [e.log.message for e in load_trace(out).events if isinstance(e, LogEvent)] == ["step 10 loss 2.3"]


def test_cli_export_of_an_ec2_job_without_a_deployment_says_how_to_name_one(
    clients: AwsClients, capsys: pytest.CaptureFixture[str]
) -> None:
    instance_id, _ = run_instance(clients)
    assert main(["export-trace", instance_id, "--region", "us-east-1", "--stack", "nope"]) == EXIT_USAGE
    assert "stack 'nope'" in capsys.readouterr().err
