"""The Stallwatch stack: wires the capabilities, tags them, and acknowledges cdk-nag findings with reasons."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aws_cdk import Acknowledgment, Aws, CfnMapping, CfnOutput, Stack, Tags, Validations
from constructs import Construct

from stacks.constants import (
    CONSOLE_HOSTS,
    DEPLOYMENT_TAG,
    INSTANCE_STREAMS,
    LAMBDA_RUNTIME,
    SERVICE_NAME,
)
from stacks.dashboards import Dashboards, job_dashboard_name
from stacks.ec2_training import Ec2Training
from stacks.health import ControlPlaneHealth, health_alarm_arns
from stacks.health_events import HostEventsConstruct
from stacks.log_subscriptions import FatalLineSubscriptions
from stacks.nag import arn_template
from stacks.notifications import Notifications
from stacks.platforms import watched
from stacks.platforms.base import Wiring
from stacks.rechecks import Rechecks
from stacks.slack_endpoint import SlackEndpoint
from stacks.state_store import StateStore
from stacks.watchdog import Watchdog
from stallwatch.core.config import JOB_DASHBOARD_URL_ENV, StallwatchConfig
from stallwatch.core.contract import CWAGENT_NAMESPACE, NAMESPACE


class StallwatchStack(Stack):
    """Detects stalled GPU training jobs (of each platform `platforms:` watches) and stops those that opted in: the
    stack wires the capabilities and the watched platforms' parts (`stacks.platforms`, `platforms` by name)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        deployment: str,
        config: StallwatchConfig,
        bundle_dependencies: bool = True,
        **kwargs: Any,
    ) -> None:
        """`deployment` names the dashboards and tags every resource (`stacks.application.add_deployment`)."""
        super().__init__(
            scope, construct_id, description=f"Stallwatch ({deployment}): stops stalled GPU training jobs", **kwargs
        )
        self.deployment = deployment
        self.config = config
        self.state = StateStore(self, "State")
        parts = watched(self, config)
        self.platforms = {part.name: part for part in parts}
        self.notifications = Notifications(
            self,
            "Notifications",
            slack=config.slack,
            emails=config.notification_emails,
            alarm_arns=health_alarm_arns(self, config.health_alarm_prefix),
        )
        self.watchdog = Watchdog(
            self,
            "Watchdog",
            config=config,
            table=self.state.table,
            slack_secret=self.notifications.slack_secret,
            bundle_dependencies=bundle_dependencies,
            platforms=parts,
            service=deployment,
        )
        self.rechecks = Rechecks(
            self,
            "Rechecks",
            deployment=deployment,
            target=self.watchdog.on_alarm,
            dead_letter_queue=self.watchdog.dead_letter_queue,
            deciders=self.watchdog.deciders,
        )
        self.slack_endpoint = SlackEndpoint(
            self,
            "SlackEndpoint",
            code=self.watchdog.code,
            config=config,
            table=self.state.table,
            slack_secret=self.notifications.slack_secret,
            job_statements=self.watchdog.permissions.slack_interactions(),
            dead_letter_queue=self.watchdog.dead_letter_queue,
            service=deployment,
        )
        functions = [*self.watchdog.functions, self.slack_endpoint.function]
        hosted = [part for part in parts if part.instance_hosts]
        if hosted:  # the platforms whose hosts are instances: AWS Health's events for them reach their jobs
            self.host_events = HostEventsConstruct(
                self,
                "HealthEvents",
                code=self.watchdog.code,
                config=config,
                table=self.state.table,
                slack_secret=self.notifications.slack_secret,
                statements=self.watchdog.permissions.host_events(),
                log_groups=[group for part in hosted for group in part.log_groups()],
                dead_letter_queue=self.watchdog.dead_letter_queue,
                service=deployment,
            )
            functions.append(self.host_events.function)
        self.health = ControlPlaneHealth(
            self,
            "Health",
            functions=functions,
            destinations=[self.slack_endpoint.function],
            dead_letter_queue=self.watchdog.dead_letter_queue,
            topic=self.notifications.topic,
            name_prefix=config.health_alarm_prefix,
            service=deployment,
        )
        self.dashboards = Dashboards(
            self,
            "Dashboards",
            deployment=deployment,
            functions=functions,
            dead_letter_queue=self.watchdog.dead_letter_queue,
            health_alarms=self.health.alarms,
        )
        self.ec2_training = Ec2Training(
            self,
            "Ec2Training",
            deployment=deployment,
            log_group=config.ec2_log_group,
            bundle_dependencies=bundle_dependencies,
        )
        self.log_subscriptions = FatalLineSubscriptions(
            self, "LogSubscriptions", deployment=deployment, config=config, destination=self.watchdog.on_log_line
        )
        wiring = Wiring(
            deployment=deployment,
            on_alarm=self.watchdog.on_alarm,
            sweeper=self.watchdog.sweeper,
            on_job_state=self.watchdog.on_job_state,
            on_log_line=self.watchdog.on_log_line,
            slack_endpoint=self.slack_endpoint.function,
            code=self.watchdog.code,
            subscriptions=self.log_subscriptions,
            nodes=self.ec2_training,
            table=self.state.table,
            dead_letter_queue=self.watchdog.dead_letter_queue,
        )
        for part in parts:
            part.build(wiring)
        self.dashboard_console_url = self._dashboard_console_url()
        self._link_job_dashboard()
        Tags.of(self).add("Service", SERVICE_NAME)
        Tags.of(self).add(DEPLOYMENT_TAG, deployment)
        self._build_outputs()
        self._acknowledge_nag_findings()

    def _dashboard_console_url(self) -> str:
        """The console URL a dashboard's name completes: this partition's console, this region."""
        console_host = CfnMapping(
            self, "ConsoleHosts", mapping={partition: {"host": host} for partition, host in CONSOLE_HOSTS.items()}
        ).find_in_map(Aws.PARTITION, "host")
        return f"https://{console_host}/cloudwatch/home?region={Aws.REGION}#dashboards/dashboard/"

    def _link_job_dashboard(self) -> None:
        """The functions that post the end-of-run summary link it to the job dashboard."""
        url = f"{self.dashboard_console_url}{job_dashboard_name(self.deployment)}"
        for function in (self.watchdog.on_job_state, self.watchdog.sweeper):
            function.add_environment(JOB_DASHBOARD_URL_ENV, url)

    def _build_outputs(self) -> None:
        """What the operator needs after deploy (docs/deploy.md, docs/operators.md), each with what to do with it."""
        dashboard_url = self.dashboard_console_url
        outputs = {
            "SlackSecretArn": (
                self.notifications.slack_secret.secret_arn,
                "Secrets Manager secret the functions read the Slack credentials from: put the app's JSON in it",
            ),
            "SlackInteractivityUrl": (
                self.slack_endpoint.url.url,
                "Request URL for the Slack app's Interactivity (deploy/slack/manifest.yaml, request_url)",
            ),
            "HealthTopicArn": (
                self.notifications.topic.topic_arn,
                "SNS topic of the control plane's health alarms: subscribe your on-call to it",
            ),
            "TableName": (
                self.state.table.table_name,
                "DynamoDB table of job state and the audit trail (kept when the stack is deleted)",
            ),
            "AlarmPrefix": (self.config.alarm_prefix, "Every per-job alarm this deployment creates starts with this"),
            "FleetDashboardUrl": (
                f"{dashboard_url}{self.dashboards.fleet.dashboard_name}",
                "CloudWatch dashboard of every job and the control plane",
            ),
            "JobDashboardUrl": (
                f"{dashboard_url}{self.dashboards.job.dashboard_name}",
                "CloudWatch dashboard of one job: pick it in the Job dropdown",
            ),
            "Ec2InstancePolicyArn": (
                self.ec2_training.policy.managed_policy_arn,
                "Managed policy to attach to the EC2 training instances' role (deploy/ec2): metrics, training logs, "
                "the agent configuration and the wheel",
            ),
            "Ec2AgentConfigParameter": (
                self.ec2_training.agent_config.parameter_name,
                "SSM parameter of the CloudWatch agent's configuration: amazon-cloudwatch-agent-ctl -c ssm:<name>",
            ),
            "Ec2LogGroup": (self.ec2_training.log_group.log_group_name, "Log group of the EC2 training logs"),
            "AgentWheelUri": (
                self.ec2_training.wheel.s3_object_url,
                "The trainer-agent wheel (a zip holding it) that deploy/ec2/user-data.sh installs on EC2 nodes",
            ),
        }
        for part in self.platforms.values():
            outputs |= part.outputs()
        for output_id, (value, description) in outputs.items():
            CfnOutput(self, output_id, value=value, description=description)

    def _node_log_findings(self, arn: str, ec2_group: str) -> dict[str, str]:
        """The training nodes' log grants (`Ec2Training`): each wildcard, and why it stays."""
        groups = (ec2_group, f"{ec2_group.rstrip('/')}/*")
        findings = {
            arn.format(service="logs", resource=f"log-group:{group}:*"): "DescribeLogStreams: the CloudWatch agent "
            "lists its group's streams; a job may name a group under the configured one"
            for group in groups
        } | {
            arn.format(service="logs", resource=f"log-group:{group}:log-stream:{INSTANCE_STREAMS}"): "each training "
            "instance's agent creates and writes streams named by its instance id, at run time (IAM cannot tie a "
            "stream to the calling instance: docs/deploy.md, Who can write what)"
            for group in groups
        }
        return findings | _merged(part.nodes_findings(arn) for part in self.platforms.values())

    def _acknowledge_nag_findings(self) -> None:
        """Each wildcard left after scoping, and why it stays."""
        arn = arn_template(self)
        ec2_group = self.config.ec2_log_group
        iam_findings = {
            "*": "ec2:DescribeInstances, cloudwatch:GetMetricData, sagemaker:ListTrainingJobs, "
            "ssm:ListCommands, ssm:ListCommandInvocations, cloudwatch:PutMetricData and X-Ray tracing support no "
            "resource-level permissions; each is conditioned "
            f"on aws:RequestedRegion or cloudwatch:namespace={NAMESPACE} where IAM offers a condition",
            arn.format(service="cloudwatch", resource=f"alarm:{self.config.alarm_prefix}*"): "per-job alarms are "
            "created at run time; writes are limited to this deployment's alarm-name prefix",
            arn.format(service="cloudwatch", resource="alarm:*"): "read-only cloudwatch:DescribeAlarms: a name-prefix "
            "query is authorized against every alarm of the account and region",
            **_merged(part.watchdog_findings(arn) for part in self.platforms.values()),
            **self.rechecks.nag_findings,
        }
        Validations.of(self.watchdog).acknowledge(
            *(
                Acknowledgment(id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{resource}]", reason=reason)
                for resource, reason in iam_findings.items()
            ),
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-L1",
                reason=f"pinned to {LAMBDA_RUNTIME.name}: the bundled wheels (pydantic-core) are built for it "
                "(stacks/constants.py); upgrade the runtime and the bundle together",
            ),
        )
        Validations.of(self.ec2_training).acknowledge(
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-IAM5[Resource::*]",
                reason="cloudwatch:PutMetricData has no resource-level permissions; conditioned on "
                f"cloudwatch:namespace {NAMESPACE} or {CWAGENT_NAMESPACE}",
            ),
            *(
                Acknowledgment(id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{resource}]", reason=reason)
                for resource, reason in self._node_log_findings(arn, ec2_group).items()
            ),
        )
        Validations.of(self.notifications).acknowledge(
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-SMG4",
                reason="Slack webhook URLs and bot tokens are issued by Slack and cannot be rotated by a Lambda; "
                "rotate them in Slack, then put the new value",
            )
        )


def _merged(findings: Iterable[dict[str, str]]) -> dict[str, str]:
    """The platforms' findings, one reason per resource (two platforms' reasons for one resource, joined)."""
    merged: dict[str, str] = {}
    for found in findings:
        for resource, reason in found.items():
            merged[resource] = f"{merged[resource]}; {reason}" if resource in merged else reason
    return merged
