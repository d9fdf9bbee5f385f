"""A small moto world for the Lambda tests: a training job, its metrics and logs, and a Slack receiver."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from localrun import moto_sagemaker
from stallwatch import contract
from stallwatch.aws_source import AwsClients

ROLE_ARN = "arn:aws:iam::123456789012:role/training"
ALARM_ACTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:stallwatch-on-alarm"
TABLE = "stallwatch-test"
MINUTE = 60.0
FUTURE_MIN = -15  # seeded series run this many minutes past the test's start


@dataclass
class Clock:
    """Epoch seconds that only move when a test says so."""

    now: float

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class LambdaContext:
    function_name: str = "stallwatch-test"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:stallwatch-test"
    aws_request_id: str = "5f4c0e2a-6d3b-4c8e-9a51-1f0b2f9d7e11"


class SlackReceiver:
    """Slack on 127.0.0.1 (an incoming webhook, or the Web API): records every JSON body, answers `status`."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        self.reply = b"ok"  # a webhook's answer; the Web API answers JSON
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.posts.append(json.loads(body))
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(receiver.reply if receiver.status == 200 else b"internal_error")

            def log_message(self, *args: Any) -> None:
                """No access log on stderr."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        """The incoming webhook's URL."""
        return f"{self.base}/services/T000/B000/XXXX"

    def __enter__(self) -> SlackReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def texts(self) -> list[str]:
        return [post["text"] for post in self.posts]


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


@dataclass
class World:
    """Seeds moto with what a running job leaves behind."""

    clients: AwsClients
    now: float
    jobs: list[str] = field(default_factory=list)

    def create_job(
        self,
        name: str,
        hosts: int = 2,
        instance_type: str = "ml.p4d.24xlarge",
        tags: dict[str, str] | None = None,
        training_since: float | None = None,
    ) -> None:
        """A SageMaker training job, InProgress / Training since `training_since` (default 2 h before now)."""
        self.clients.sagemaker.create_training_job(
            TrainingJobName=name,
            AlgorithmSpecification={"TrainingImage": "train:latest", "TrainingInputMode": "File"},
            RoleArn=ROLE_ARN,
            OutputDataConfig={"S3OutputPath": "s3://bucket/out"},
            ResourceConfig={"InstanceType": instance_type, "InstanceCount": hosts, "VolumeSizeInGB": 100},
            StoppingCondition={"MaxRuntimeInSeconds": 86400},
            Tags=[{"Key": k, "Value": v} for k, v in (tags or {}).items()],
        )
        since = training_since if training_since is not None else self.now - 120 * MINUTE
        moto_sagemaker.set_training_job_status(name, "InProgress", "Training", at=since)
        self.jobs.append(name)

    def status(self, name: str) -> str:
        return self.clients.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"]

    def metric(
        self, namespace: str, name: str, dims: dict[str, str], points: Iterable[tuple[float, float]], unit: str = "None"
    ) -> None:
        data = [
            {
                "MetricName": name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Timestamp": _dt(t),
                "Value": value,
                "Unit": unit,
            }
            for t, value in points
        ]
        for offset in range(0, len(data), 500):
            self.clients.cloudwatch.put_metric_data(Namespace=namespace, MetricData=data[offset : offset + 500])

    def every_minute(self, start_min: float, value: Any, end_min: float = FUTURE_MIN) -> list[tuple[float, float]]:
        """Points each minute from `start_min` minutes before now to `end_min` (default: a little past now, so a
        test can move its clock); `value(minutes_ago)` or a constant."""
        points = []
        m = start_min
        while m >= end_min:
            points.append((self.now - m * MINUTE, value(m) if callable(value) else float(value)))
            m -= 1
        return points

    def host_gpu(self, job: str, host: str, points: list[tuple[float, float]], gpus: int = 8) -> None:
        """SageMaker's host GPU utilization: per-device percent x GPUs, as SageMaker publishes it."""
        dims = {"Host": f"{job}/{host}"}
        self.metric(contract.SAGEMAKER_NAMESPACE, "GPUUtilization", dims, [(t, v * gpus) for t, v in points], "Percent")
        self.metric(
            contract.SAGEMAKER_NAMESPACE, "GPUMemoryUtilization", dims, [(t, 60.0 * gpus) for t, _ in points], "Percent"
        )

    def agent_job(self, job: str, name: str, points: list[tuple[float, float]]) -> None:
        self.metric(contract.NAMESPACE, name, {contract.DIM_JOB: job}, points, contract.JOB_METRICS[name])

    def agent_host(self, job: str, host: str, name: str, points: list[tuple[float, float]]) -> None:
        dims = {contract.DIM_JOB: job, contract.DIM_HOST: host}
        self.metric(contract.NAMESPACE, name, dims, points, contract.HOST_METRICS[name])

    def steps_until(self, job: str, last_step_min: float, start_min: float = 110) -> None:
        """The agent's job metrics: one step a minute from `start_min` until `last_step_min` minutes ago."""
        step = lambda m: max(0.0, start_min - max(m, last_step_min))  # noqa: E731 - a tiny local curve
        self.agent_job(job, "Step", self.every_minute(start_min, step))
        self.agent_job(job, "Steps", self.every_minute(start_min, lambda m: 1.0 if m > last_step_min else 0.0))
        age = lambda m: 0.0 if m > last_step_min else (last_step_min - m) * MINUTE  # noqa: E731
        self.agent_job(job, "LastStepAge", self.every_minute(start_min, age))

    def logs(self, job: str, host: str, lines: list[tuple[float, str]]) -> None:
        """Log lines (minutes ago, message) on the host's SageMaker stream."""
        group, stream = contract.SAGEMAKER_LOG_GROUP, f"{job}/{host}-1700000000"
        logs = self.clients.logs
        if not logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"]:
            logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        events = [{"timestamp": int((self.now - m * MINUTE) * 1000), "message": msg} for m, msg in lines]
        logs.put_log_events(
            logGroupName=group, logStreamName=stream, logEvents=sorted(events, key=lambda e: e["timestamp"])
        )

    def progress_logs(self, job: str, host: str, until_min: float, extra: list[tuple[float, str]] = ()) -> None:
        lines = [(m, f"step {int(110 - m)} loss 2.31") for m in range(110, int(until_min) - 1, -5)]
        self.logs(job, host, lines + list(extra))


def alarm_event(name: str, timestamp: str = "2026-11-30T10:00:00.000+0000", state: str = "ALARM") -> dict[str, Any]:
    """The payload CloudWatch sends to a Lambda alarm action."""
    return {
        "source": "aws.cloudwatch",
        "alarmArn": f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{name}",
        "accountId": "123456789012",
        "time": timestamp,
        "region": "us-east-1",
        "alarmData": {
            "alarmName": name,
            "state": {"value": state, "reason": "Threshold Crossed", "timestamp": timestamp},
            "previousState": {"value": "OK", "reason": "", "timestamp": "2026-11-30T09:00:00.000+0000"},
            "configuration": {"description": "Stallwatch alarm", "metrics": []},
        },
    }


def job_state_event(name: str, status: str, hosts: int = 2, tags: dict[str, str] | None = None) -> dict[str, Any]:
    """EventBridge "SageMaker Training Job State Change"."""
    return {
        "version": "0",
        "id": "0b3c7c1e-2d7c-4a4e-9c39-5c3ac3d1f0aa",
        "detail-type": "SageMaker Training Job State Change",
        "source": "aws.sagemaker",
        "account": "123456789012",
        "time": "2026-11-30T10:00:00Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}"],
        "detail": {
            "TrainingJobName": name,
            "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
            "TrainingJobStatus": status,
            "SecondaryStatus": "Training" if status == "InProgress" else status,
            "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": hosts, "VolumeSizeInGB": 100},
            "Tags": tags or {},
        },
    }


def instance_state_event(instance_id: str, state: str) -> dict[str, Any]:
    """EventBridge "EC2 Instance State-change Notification"."""
    return {
        "version": "0",
        "id": "7bf73129-1428-4cd3-a780-95db273d1602",
        "detail-type": "EC2 Instance State-change Notification",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-30T10:00:00Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "state": state},
    }


def scheduled_event() -> dict[str, Any]:
    return {
        "version": "0",
        "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": "2026-11-30T10:00:00Z",
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/stallwatch-sweeper"],
        "detail": {},
    }
