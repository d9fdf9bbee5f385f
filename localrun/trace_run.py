"""A SageMaker trace (the corpus's, or one ``stallwatch export-trace`` wrote) played onto moto as the AWS history it
stands for, then ``stallwatch report`` on it: a backtest's goodput report and chart, without an AWS account.

    python -m localrun.trace_run corpus/traces/sm-hang-8host-agent.jsonl
    python -m localrun.trace_run corpus/traces/sm-hang-8host-agent.jsonl --plot goodput.png   # and its chart

What lands in moto: the training job (instance type and count, tags), its status history from the trace, the agent's
job metrics (what the goodput windows read), and, if the replay stops the job, Stallwatch's stop in the audit table
(the stall's onset from the engine's evidence), at which the job ends; a job the replay does not stop ends with the
trace. Trace time t is epoch `PLAY_EPOCH` + t: t = 0 on a whole minute, so that the periods moto's GetMetricData
aggregates (from the read's StartTime) fall where CloudWatch's do (whole minutes).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import moto  # imported before any boto3 client is created

from localrun import moto_sagemaker
from localrun.resources import create_table
from stallwatch.aws.agent_windows import WINDOW_METRICS
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.job_states import JobStates, StoredState
from stallwatch.aws.store import Store, job_key
from stallwatch.core import contract
from stallwatch.core.decision import Action, JobState
from stallwatch.core.signals import Platform
from stallwatch.core.trace import MetricEvent, StatusEvent, Trace
from stallwatch.offline import cli
from stallwatch.offline.replay import replay
from stallwatch.offline.trace_file import load_trace
from stallwatch.offline.trace_source import TRACE_EPOCH

TABLE = "stallwatch-trace-run"
ROLE_ARN = "arn:aws:iam::123456789012:role/stallwatch-trace-run"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311"
PUT_METRIC_DATA_MAX = 1000  # datums per PutMetricData call
TRIGGER = "replay"
PLAY_EPOCH = TRACE_EPOCH // 60 * 60


def play_trace(clients: AwsClients, store: Store, trace: Trace, epoch: float = PLAY_EPOCH) -> str:
    """Put `trace`'s job into moto (SageMaker, CloudWatch and `store`) as it ran, up to the replay's stop, its t = 0 at
    `epoch` (a whole minute); its name."""
    job = trace.job

    def _at(t: float) -> float:
        return epoch + t

    if job.platform is not Platform.SAGEMAKER:
        raise ValueError(f"{trace.source}: a {job.platform.value} trace; only SageMaker traces are played onto moto")
    result = replay(trace)
    stopped = next((d for d in result.decisions if d.decision.action is Action.STOP), None)
    end = stopped.t if stopped is not None else trace.duration_s
    _create_job(clients, trace, epoch)
    final = "Stopped" if stopped is not None else "Completed"
    for event in trace.events:
        if isinstance(event, StatusEvent) and event.t <= end:
            if event.status.winding_down:
                final = event.status
                end = event.t
                break
            moto_sagemaker.set_training_job_status(
                job.name, event.status, event.secondary or event.status, at=_at(event.t)
            )
    _put_agent_windows(clients, trace, end, epoch)
    moto_sagemaker.set_training_job_status(job.name, final, final, at=_at(end))
    if stopped is not None and stopped.t <= end:
        decision = stopped.decision
        audit = {
            "at": _at(stopped.t),
            "job": job.name,
            "platform": job.platform.value,
            "trigger": TRIGGER,
            "mode": decision.mode.value,
            "diagnosis": decision.diagnosis.value,
            "action": decision.action.value,
            "would": decision.would.value,
            "reasons": list(decision.reasons),
            "evidence": _onset_evidence(decision.evidence, epoch),
        }
        state = StoredState(JobState(stopped_at=_at(stopped.t)))
        JobStates(store).commit(job_key(job.platform, job.name), StoredState(), state, audit, _at(stopped.t))
    return job.name


def _onset_evidence(evidence: dict[str, Any], epoch: float) -> dict[str, Any]:
    """What a stop record reads of the stall's onset (`decision.stall_onset`: the last step, else the last log line),
    moved from the replay's epoch to the play's."""
    agent, logs = evidence.get("agent") or {}, evidence.get("logs") or {}
    moved: dict[str, Any] = {}
    if agent.get("last_step_t") is not None:
        moved["agent"] = {"step": agent.get("step"), "last_step_t": epoch + agent["last_step_t"] - TRACE_EPOCH}
    if logs.get("last_t") is not None:
        moved["logs"] = {"last_t": epoch + logs["last_t"] - TRACE_EPOCH}
    return moved


def _create_job(clients: AwsClients, trace: Trace, epoch: float) -> None:
    job = trace.job
    resources = {"InstanceType": job.instance_type, "InstanceCount": job.instance_count, "VolumeSizeInGB": 100}
    clients.sagemaker.create_training_job(
        TrainingJobName=job.name,
        AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        RoleArn=ROLE_ARN,
        OutputDataConfig={"S3OutputPath": "s3://stallwatch-trace-run/output"},
        ResourceConfig=resources,
        StoppingCondition={"MaxRuntimeInSeconds": 28 * 86_400},
        Tags=[{"Key": k, "Value": v} for k, v in job.tags.items()],
    )
    moto_sagemaker.set_training_job_status(job.name, "InProgress", "Starting", at=epoch)


def _put_agent_windows(clients: AwsClients, trace: Trace, end: float, epoch: float) -> None:
    """The agent's job metrics the goodput reads (`agent_windows.WINDOW_METRICS`), up to `end`."""
    dims = {contract.DIM_JOB: trace.job.name}
    data = [
        {
            "MetricName": e.metric.name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
            "Timestamp": datetime.fromtimestamp(epoch + e.t, UTC),
            "Value": e.metric.value,
            "Unit": contract.JOB_METRICS[e.metric.name],
        }
        for e in trace.events
        if isinstance(e, MetricEvent)
        and e.t <= end
        and e.metric.namespace == contract.NAMESPACE
        and e.metric.name in WINDOW_METRICS
        and e.metric.dimensions == dims
    ]
    for offset in range(0, len(data), PUT_METRIC_DATA_MAX):
        batch = data[offset : offset + PUT_METRIC_DATA_MAX]
        clients.cloudwatch.put_metric_data(Namespace=contract.NAMESPACE, MetricData=batch)


def main(argv: Sequence[str] | None = None) -> int:
    """Play the trace onto moto and print ``stallwatch report`` of its job (with ``--plot``, its chart too)."""
    parser = argparse.ArgumentParser(prog="python -m localrun.trace_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a SageMaker trace file (format v1)")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="also write the report's chart")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    moto_sagemaker.install()
    with moto.mock_aws():
        clients = AwsClients(region="us-east-1")
        create_table(clients.dynamodb, TABLE)
        name = play_trace(clients, Store(clients.dynamodb, TABLE, 30), load_trace(args.trace))
        report = ["report", name, "--table", TABLE, "--region", "us-east-1"]
        return cli.main(report + (["--json"] if args.json else []) + (["--plot", str(args.plot)] if args.plot else []))


if __name__ == "__main__":
    raise SystemExit(main())
