"""deploy/ec2: what a user installs on EC2 training nodes matches what the control plane reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

from stallwatch.core import alarms, clusters, contract
from stallwatch.core.config import EC2_LOG_GROUP
from stallwatch.core.policy import MODE_TAG
from stallwatch.core.reading import EC2_STREAM

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "ec2"
AGENT_CONFIG = json.loads((DEPLOY / "cloudwatch-agent.json").read_text())
CWAGENT_METRIC_PREFIX = "nvidia_smi_"  # the CloudWatch agent names nvidia_gpu measurements nvidia_smi_<measurement>


def test_the_cloudwatch_agent_publishes_the_per_instance_gpu_metrics_the_alarms_read() -> None:
    metrics = AGENT_CONFIG["metrics"]
    published = {CWAGENT_METRIC_PREFIX + m for m in metrics["metrics_collected"]["nvidia_gpu"]["measurement"]}
    assert metrics["namespace"] == contract.CWAGENT_NAMESPACE
    assert {
        alarms.CWAGENT_GPU_UTILIZATION,
        alarms.CWAGENT_GPU_MEMORY_USED,
        alarms.CWAGENT_GPU_MEMORY_TOTAL,
    } <= published
    assert metrics["append_dimensions"] == {alarms.CWAGENT_DIM_INSTANCE: "${aws:InstanceId}"}
    assert metrics["aggregation_dimensions"] == [[alarms.CWAGENT_DIM_INSTANCE]]


def test_the_cloudwatch_agent_ships_logs_to_the_ec2_log_group_one_stream_per_instance_id() -> None:
    [files] = AGENT_CONFIG["logs"]["logs_collected"]["files"]["collect_list"]
    assert files["log_group_name"] == EC2_LOG_GROUP
    stream = files["log_stream_name"].replace("{instance_id}", "i-0123456789abcdef0")
    assert EC2_STREAM.match(stream)["host"] == "i-0123456789abcdef0"


def test_the_user_data_installs_the_same_agent_configuration() -> None:
    user_data = (DEPLOY / "user-data.sh").read_text()
    embedded = re.search(r"<<'JSON'\n(.*?)\nJSON\n", user_data, re.DOTALL)
    assert json.loads(embedded[1]) == AGENT_CONFIG


def test_the_launch_example_tags_every_node_with_the_job_and_exposes_tags_to_the_agent() -> None:
    launch = (DEPLOY / "launch.sh").read_text()
    assert f"Key={clusters.JOB_TAG},Value=$JOB" in launch
    assert f"Key={MODE_TAG},Value=$MODE" in launch
    assert "InstanceMetadataTags=enabled" in launch
    assert "Ec2InstancePolicyArn" in launch
