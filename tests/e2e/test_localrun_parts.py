"""The local run's plumbing, piece by piece: fast, on moto in-process or on local sockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import boto3
import moto  # imported before any boto3 client is created
import pytest
from rich.console import Console
from slack_sdk.webhook import WebhookClient

from localrun import aws_events
from localrun.__main__ import build_parser, main
from localrun.alarm_loop import AlarmLoop
from localrun.aws_events import AlarmStateRecord, TrainingJobRecord
from localrun.host_metrics import HostMetricsSimulator
from localrun.host_run import parse_progress
from localrun.lambda_runtime import LambdaRuntime, function_arn
from localrun.local_aws import LocalAws, scoped_environ
from localrun.log_shipper import LogShipper
from localrun.resources import ON_ALARM, create_resources
from localrun.scenarios import COMPRESSED_TAGS, DEMO_ALARM_PERIOD_S, GPUS_PER_HOST, SCENARIOS, HostActivity
from localrun.slack_receiver import SlackMessage, SlackReceiver
from localrun.training import TrainingProcess
from localrun.view import slack_panel
from stallwatch.aws.events import AlarmEvent, JobStateEvent, parse_event
from stallwatch.core import contract
from stallwatch.core.alarms import render_alarms
from stallwatch.core.policy import Policy
from stallwatch.core.signals import JobFacts, Platform
from stallwatch.runtime.environment import Runtime

JOB = "demo-job"
PREFIX = "stallwatch-"


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def aws() -> Any:
    with moto.mock_aws():
        yield


def _facts() -> JobFacts:
    return JobFacts(
        name=JOB,
        platform=Platform.SAGEMAKER,
        status="InProgress",
        secondary_status="Training",
        start_time=0.0,
        instance_type="ml.p4d.24xlarge",
        instance_count=1,
        gpus_per_host=8,
        vcpus_per_host=96,
        tags=dict(COMPRESSED_TAGS),
    )


def test_slack_receiver_keeps_webhook_posts_and_frees_its_port() -> None:
    # Given a receiver
    received = []
    with SlackReceiver(on_message=received.append) as slack:
        port = slack.port
        # When the real Slack SDK posts to it, and something posts to another path
        response = WebhookClient(slack.webhook_url).send(text="hello", blocks=[{"type": "divider"}])
        foreign = WebhookClient(slack.webhook_url.replace("/services/", "/other/")).send(text="nope")
    # Then Slack's answer is mimicked, only the webhook's post is kept, and the port is closed afterwards
    assert (response.status_code, response.body) == (200, "ok")
    assert foreign.status_code == 400
    assert [m.payload["text"] for m in received] == ["hello"]
    assert [m.text for m in slack.messages] == ["hello"]
    assert _refused(port)


def test_local_aws_serves_on_loopback_and_restores_the_environment() -> None:
    before = os.environ.get("AWS_ENDPOINT_URL")
    with LocalAws() as local:
        port = local.port
        assert os.environ["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        local.client("sqs").create_queue(QueueName="probe")
        assert boto3.client("sqs", region_name="us-east-1").list_queues()["QueueUrls"]
    assert os.environ.get("AWS_ENDPOINT_URL") == before
    assert _refused(port)


def test_log_shipper_ships_lines_in_order_and_drops_empty_ones(aws: None) -> None:
    logs = boto3.client("logs", region_name="us-east-1")
    errors: list[str] = []
    shipper = LogShipper(logs, contract.SAGEMAKER_LOG_GROUP, f"{JOB}/algo-1-1", lambda w, e: errors.append(str(e)))
    shipper.start()
    now = time.time()
    for i, line in enumerate(["step 1", "", "   ", "step 2"]):
        shipper.add(now + i, line)
    shipper.stop()
    events = logs.get_log_events(logGroupName=contract.SAGEMAKER_LOG_GROUP, logStreamName=f"{JOB}/algo-1-1")["events"]
    assert [e["message"] for e in events] == ["step 1", "step 2"]
    assert shipper.shipped == 2
    assert not errors


def test_host_metrics_are_summed_over_gpus_like_sagemaker(aws: None) -> None:
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    simulator = HostMetricsSimulator(cloudwatch, JOB, "algo-1", activity=lambda: HostActivity.HUNG)
    simulator.publish()
    assert simulator.sample(HostActivity.HUNG)["GPUUtilization"] == 100.0 * GPUS_PER_HOST
    assert simulator.sample(HostActivity.EXITED)["GPUMemoryUtilization"] == 0.0
    metrics = cloudwatch.list_metrics(Namespace=contract.SAGEMAKER_NAMESPACE)["Metrics"]
    assert {m["MetricName"] for m in metrics} >= {"GPUUtilization", "GPUMemoryUtilization", "CPUUtilization"}
    assert {d["Value"] for m in metrics for d in m["Dimensions"]} == {f"{JOB}/algo-1"}


def test_alarm_loop_evaluates_moto_alarms_and_mirrors_their_state(aws: None) -> None:
    # Given the job's real alarm definitions in moto, and no step for the last minute
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    for definition in render_alarms(_facts(), Policy().for_job(COMPRESSED_TAGS), PREFIX, ["arn:aws:lambda:x"]):
        cloudwatch.put_metric_alarm(**definition)
    now = time.time()
    data = [
        {
            "MetricName": "Steps",
            "Dimensions": [{"Name": contract.DIM_JOB, "Value": JOB}],
            "Value": 0.0,
            "Timestamp": datetime.fromtimestamp(now - age, UTC),
            "StorageResolution": 1,
        }
        for age in range(2, 80, 2)
    ]
    cloudwatch.put_metric_data(Namespace=contract.NAMESPACE, MetricData=data)
    fired: list[tuple[str, str, str]] = []
    loop = AlarmLoop(
        cloudwatch,
        f"{PREFIX}sagemaker.{JOB}.",
        lambda alarm, state, previous: fired.append((alarm["AlarmName"], previous.value, state.value)),
    )
    # When it ticks twice
    loop.tick(now)
    loop.tick(now + 1)
    # Then the progress alarm went to ALARM once, and moto says so too
    progress = f"{PREFIX}sagemaker.{JOB}.progress"
    assert (progress, "INSUFFICIENT_DATA", "ALARM") in fired
    assert sum(1 for name, _, new in fired if name == progress) == 1
    described = cloudwatch.describe_alarms(AlarmNames=[progress])["MetricAlarms"][0]
    assert described["StateValue"] == "ALARM"


def test_events_have_the_shapes_the_handlers_parse() -> None:
    job = TrainingJobRecord(
        name=JOB,
        arn=f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{JOB}",
        instance_type="ml.p4d.24xlarge",
        instance_count=2,
        tags={"stallwatch:mode": "enforce"},
        created_at=1_700_000_000.0,
        role_arn="arn:aws:iam::123456789012:role/r",
        image="image",
        max_runtime_s=86_400,
    )
    raw_state_change = aws_events.training_job_state_change(job, "Stopped", "Stopped", 1_700_000_100.0)
    state_change = parse_event(raw_state_change, JobStateEvent)
    assert state_change.detail.training_job_status == "Stopped"
    assert state_change.detail.resource_config.instance_count == 2
    alarm = {
        "AlarmName": f"{PREFIX}sagemaker.{JOB}.progress",
        "AlarmArn": f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{PREFIX}sagemaker.{JOB}.progress",
        "AlarmDescription": "d",
        "Namespace": contract.NAMESPACE,
        "MetricName": "Steps",
        "Dimensions": [{"Name": contract.DIM_JOB, "Value": JOB}],
        "Period": 10,
        "Statistic": "Sum",
    }
    raw = aws_events.alarm_action(
        alarm, AlarmStateRecord("ALARM", "r", 1_700_000_100.0), AlarmStateRecord("OK", "r", 1_700_000_000.0)
    )
    parsed = parse_event(raw, AlarmEvent)
    assert parsed.alarm.alarm_name == alarm["AlarmName"]
    assert parsed.alarm.state.value == "ALARM"
    assert raw["alarmData"]["configuration"]["metrics"][0]["metricStat"]["metric"]["name"] == "Steps"


def test_lambda_runtime_ships_the_functions_output_and_reports_errors(aws: None) -> None:
    logs = boto3.client("logs", region_name="us-east-1")

    def talkative(event: dict[str, Any], context: Any) -> dict[str, Any]:
        print(json.dumps({"message": "deciding", "function": context.function_name}))
        return {"ok": event["n"]}

    def failing(event: dict[str, Any], context: Any) -> None:
        raise ValueError("malformed event")

    runtime = LambdaRuntime(logs, {"talkative": talkative, "failing": failing})
    ok = runtime.invoke("talkative", {"n": 1})
    bad = runtime.invoke("failing", {})
    assert (ok.result, ok.error) == ({"ok": 1}, None)
    assert isinstance(bad.error, ValueError)
    group = "/aws/lambda/stallwatch-talkative"
    stream = logs.describe_log_streams(logGroupName=group)["logStreams"][0]["logStreamName"]
    messages = [e["message"] for e in logs.get_log_events(logGroupName=group, logStreamName=stream)["events"]]
    assert any('"function": "stallwatch-talkative"' in m for m in messages)
    assert messages[0].startswith("START RequestId:")


def test_kill_group_leaves_no_process_even_one_that_ignores_sigterm() -> None:
    # Given a child that ignores SIGTERM and has a grandchild
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    lines: list[str] = []
    process = TrainingProcess([sys.executable, "-c", script], dict(os.environ), lambda t, line: lines.append(line))
    process.start()
    deadline = time.monotonic() + 30
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(lines[0])
    # When the group is killed
    process.kill_group(grace_s=0.5)
    # Then neither the child nor the grandchild survives
    assert process.poll() == -signal.SIGKILL
    for pid in (process.pid, grandchild):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert subprocess.run(["pgrep", "-g", str(process.pid)], check=False).returncode == 1


def test_progress_comes_from_the_agents_job_line_only() -> None:
    job_line = json.dumps({"_aws": {}, "Scope": "job", "Step": 12.0, "TFLOPsPerAccelerator": 0.02, "LastStepAge": 0.1})
    host_line = json.dumps({"_aws": {}, "Scope": "host", "Heartbeat": 1.0})
    progress = parse_progress(5.0, job_line)
    assert progress is not None
    assert (progress.step, progress.tflops_per_gpu, progress.t) == (12, 0.02, 5.0)
    assert parse_progress(5.0, host_line) is None
    assert parse_progress(5.0, "step 12 loss 3.1") is None


def test_slack_panel_renders_block_kit_one_line_per_field() -> None:
    payload = {
        "text": "fallback",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": ":octagonal_sign: Stopped stalled job: j"}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": "*Diagnosis*\nhang"}]},
            {"type": "section", "text": {"type": "mrkdwn", "text": "*algo-1*\n```line one\nline two```"}},
        ],
    }
    console = Console(width=80, record=True)
    console.print(slack_panel(SlackMessage(t=0.0, payload=payload)))
    text = console.export_text()
    assert "🛑 Stopped stalled job: j" in text
    assert "Diagnosis: hang" in text
    assert "line two" in text


def test_slack_panel_shows_escaped_text_as_slack_does() -> None:
    # Given a message whose log line and arrow were escaped for Slack (aws.slack_text)
    line = "*algo-1*\n```ERROR &lt;!channel&gt; a &amp; b```"
    payload = {"blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": f"96% before -&gt; 50% now\n{line}"}}]}
    console = Console(width=80, record=True)
    console.print(slack_panel(SlackMessage(t=0.0, payload=payload)))
    text = console.export_text()
    assert "96% before -> 50% now" in text
    assert "ERROR <!channel> a & b" in text


def test_runtime_resources_are_what_the_functions_read(aws: None) -> None:
    # Given the stack's resources created in moto
    resources = create_resources(
        boto3.client("dynamodb", region_name="us-east-1"),
        boto3.client("secretsmanager", region_name="us-east-1"),
        boto3.client("scheduler", region_name="us-east-1"),
        "http://127.0.0.1:9/services/x",
    )
    # When the functions build their runtime from that environment
    with scoped_environ(dict(resources.function_env())):
        runtime = Runtime.from_env()
    # Then they find the table, the secret with the webhook, the recheck group targeting on_alarm, and a
    # high-resolution policy
    assert runtime.store.table == resources.table_name
    assert runtime.rechecks is not None
    assert runtime.rechecks.target.group == resources.recheck_group
    assert runtime.rechecks.target.function_arn == function_arn(ON_ALARM)
    groups = boto3.client("scheduler", region_name="us-east-1").list_schedule_groups()["ScheduleGroups"]
    assert resources.recheck_group in {g["Name"] for g in groups}
    assert runtime.config.policy.thresholds.alarm_period_seconds == DEMO_ALARM_PERIOD_S
    secret = boto3.client("secretsmanager", region_name="us-east-1").get_secret_value(SecretId=resources.secret_arn)
    assert json.loads(secret["SecretString"]) == {"webhook_url": "http://127.0.0.1:9/services/x"}
    ttl = boto3.client("dynamodb", region_name="us-east-1").describe_time_to_live(TableName=resources.table_name)
    assert ttl["TimeToLiveDescription"]["AttributeName"] == "expires_at"


def test_the_command_line_offers_every_scenario() -> None:
    help_text = build_parser().format_help()
    assert all(name in help_text for name in SCENARIOS)
    assert build_parser().parse_args([]).scenario == "hang"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--recover", "restart"], "recovery in place is for EC2 clusters (add --platform ec2)"),
        (["--platform", "ec2", "--scenario", "idle", "--recover", "restart"], "recovers crash, hang, xid (not idle)"),
    ],
)
def test_recover_restart_is_refused_where_it_cannot_apply(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # When the demo is asked to recover a SageMaker job, or a scenario no restart fixes
    with pytest.raises(SystemExit) as exited:
        main(argv)
    # Then it says why, with argparse's usage error, before starting anything
    assert exited.value.code == 2
    assert error in capsys.readouterr().err


def test_the_functions_find_the_recovery_documents_the_demo_creates(aws: None) -> None:
    # Given the resources of a demo run that recovers in place
    resources = create_resources(
        boto3.client("dynamodb", region_name="us-east-1"),
        boto3.client("secretsmanager", region_name="us-east-1"),
        boto3.client("scheduler", region_name="us-east-1"),
        "http://127.0.0.1:9/services/x",
        boto3.client("ssm", region_name="us-east-1"),
    )
    # When the functions build their runtime from that environment
    with scoped_environ(dict(resources.function_env())):
        runtime = Runtime.from_env()
    # Then both documents exist as Command documents, with the content of deploy/ssm
    ssm = boto3.client("ssm", region_name="us-east-1")
    for name in (runtime.documents.health_check, runtime.documents.restart):
        document = ssm.get_document(Name=name)
        assert document["DocumentType"] == "Command"
        assert json.loads(document["Content"])["mainSteps"][0]["action"] == "aws:runShellScript"
