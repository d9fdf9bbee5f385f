"""Every default the stacks build with, in one place."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

from stallwatch.core.config import ON_ALARM_TIMEOUT_SECONDS, ON_LOG_LINE_TIMEOUT_SECONDS, SWEEPER_TIMEOUT_SECONDS

SERVICE_NAME = "stallwatch"
CONFIG_CONTEXT_KEY = "stallwatch"
CONFIG_FILE_CONTEXT_KEY = "stallwatch:config-file"
# The deployment's name: the stack's name, the dashboards' and the alarm prefix's start. Two deployments with distinct
# names share an account and region.
DEPLOYMENT_CONTEXT_KEY = "stallwatch:deployment"
DEFAULT_DEPLOYMENT = "stallwatch"
# Fits every name it starts: stack (+ "-<region>"), dashboards, and the alarm prefix (config.ALARM_PREFIX_PATTERN).
DEPLOYMENT_NAME_PATTERN = r"^[A-Za-z](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?$"
DEPLOYMENT_TAG = "stallwatch:deployment"
# The AWS console's host in each partition the stack may be deployed to (dashboard URLs in the outputs).
CONSOLE_HOSTS = {
    "aws": "console.aws.amazon.com",
    "aws-cn": "console.amazonaws.cn",
    "aws-us-gov": "console.amazonaws-us-gov.com",
}
# False synthesizes without installing lambdas/requirements.lock (offline: tests, reviews); never deploy such an asset.
BUNDLE_DEPENDENCIES_CONTEXT_KEY = "stallwatch:bundle-dependencies"

REPO_ROOT = Path(__file__).resolve().parent.parent
LAMBDA_SOURCE_DIR = REPO_ROOT / "lambdas"
LAMBDA_PACKAGES = ("stallwatch", "handlers")
# What the functions import (top-level pins), and every package of the asset pinned with hashes (`make lambda-lock`).
LAMBDA_REQUIREMENTS = "requirements.txt"
LAMBDA_LOCK = "requirements.lock"

# The trainer agent's dependencies for EC2 nodes ([aws,nvml]), pinned with hashes (`make lambda-lock` writes it too):
# their wheels travel in the agent's asset, so a node installs with `pip install --no-index`. All are pure Python:
# one set serves every architecture and the agent's Pythons, resolved for the oldest it supports.
AGENT_EXTRAS = ("aws", "nvml")
AGENT_LOCK = REPO_ROOT / "deploy" / "ec2" / "agent-requirements.lock"
AGENT_OLDEST_PYTHON = "3.10"

LAMBDA_RUNTIME = lambda_.Runtime.PYTHON_3_12
LAMBDA_ARCHITECTURE = lambda_.Architecture.ARM_64
LAMBDA_MEMORY_MB = 512
LAMBDA_LOG_RETENTION = logs.RetentionDays.THREE_MONTHS
ON_JOB_STATE_TIMEOUT = Duration.seconds(60)
ON_ALARM_TIMEOUT = Duration.seconds(ON_ALARM_TIMEOUT_SECONDS)
ON_LOG_LINE_TIMEOUT = Duration.seconds(ON_LOG_LINE_TIMEOUT_SECONDS)
SWEEPER_TIMEOUT = Duration.seconds(SWEEPER_TIMEOUT_SECONDS)
LOG_SUBSCRIPTION_TIMEOUT = Duration.minutes(1)  # the custom resource: three Logs calls
SLACK_INTERACTIONS_TIMEOUT = Duration.seconds(30)
ON_HEALTH_EVENT_TIMEOUT = Duration.seconds(120)  # the running jobs listed, each affected one's checkpoint lines read

ON_JOB_STATE_HANDLER = "handlers.on_job_state.handler"
ON_ALARM_HANDLER = "handlers.on_alarm.handler"
SWEEPER_HANDLER = "handlers.sweeper.handler"
ON_LOG_LINE_HANDLER = "handlers.on_log_line.handler"
LOG_SUBSCRIPTION_HANDLER = "handlers.log_subscription.handler"
SLACK_INTERACTIONS_HANDLER = "handlers.slack_interactions.handler"
ON_HEALTH_EVENT_HANDLER = "handlers.on_health_event.handler"

# The principal CloudWatch uses to invoke a Lambda alarm action.
ALARM_ACTION_PRINCIPAL = "lambda.alarms.cloudwatch.amazonaws.com"
# The principal CloudWatch Logs delivers a subscription's log events with.
LOGS_PRINCIPAL = "logs.amazonaws.com"

DLQ_RETENTION = Duration.days(14)
# A failed Slack press that could not be posted back this many times goes to the dead-letter queue (which alarms).
FAILED_PRESS_RECEIVES = 5
# EventBridge retries a failed delivery this often before it goes to the DLQ.
EVENT_RETRY_ATTEMPTS = 2
HEALTH_ALARM_PERIOD = Duration.minutes(5)
CLOUDWATCH_SERVICE_PRINCIPAL = "cloudwatch.amazonaws.com"
DASHBOARD_PERIOD = Duration.minutes(1)

# EC2 training nodes (deploy/ec2): the trainer-agent wheel the stack publishes (built from these files of the
# repository), the CloudWatch agent's configuration (an SSM parameter the agent fetches by name), and how long the
# training logs are kept.
AGENT_WHEEL_SOURCES = ("trainer_agent", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")
CLOUDWATCH_AGENT_CONFIG = REPO_ROOT / "deploy" / "ec2" / "cloudwatch-agent.json"
# The CloudWatch agent's own naming convention (its managed policies read AmazonCloudWatch-*); flat, as
# `amazon-cloudwatch-agent-ctl -c ssm:<name>` expects.
CLOUDWATCH_AGENT_PARAMETER = "AmazonCloudWatch-{deployment}-ec2"
# The streams the training nodes may write, by name: an EC2 node's and a Slurm node's are named by its instance id (the
# CloudWatch agent's {instance_id}: deploy/ec2/cloudwatch-agent.json, deploy/slurm/cloudwatch-agent.json), in the EC2
# group and the groups under it (the Slurm group is one).
INSTANCE_STREAMS = "i-*"
EC2_LOG_RETENTION = logs.RetentionDays.ONE_MONTH
