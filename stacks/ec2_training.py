"""What EC2 training nodes need from the stack (deploy/ec2): the log group, the CloudWatch agent's configuration,
the trainer-agent wheel, and one customer managed policy for their instance role that covers exactly what they do.

- the log group `ec2_log_group`, with retention (the agent writes to it, and never creates or configures a group);
- an SSM parameter holding deploy/ec2/cloudwatch-agent.json with that group (`fetch-config -c ssm:<name>`);
- the wheel as an S3 asset, with its dependencies' wheels (user-data installs them with ``--no-index``: never a
  package index);
- the policy: PutMetricData in ``Stallwatch`` and ``CWAgent``; log streams named by an instance id (``i-...``, the
  agent's ``{instance_id}``) and their events in the group and the groups under it (which a job's
  ``stallwatch:log-group`` tag may name); GetParameter of the configuration; GetObject of the wheel. Nothing else:
  no EC2, SageMaker or alarm permissions.

IAM cannot say more (Service Authorization Reference): PutMetricData has no resource type and no condition key but
``cloudwatch:namespace``, so no dimension (InstanceId, Host, JobName) can be tied to the caller; and no request value
names the calling instance as a stream name can (``aws:userid`` is ``<role id>:<instance id>``,
``ec2:SourceInstanceARN`` an ARN, and a stream name holds no ``:``), so a node may write any instance's stream of the
group. What remains, and what the control plane does about it: docs/deploy.md, "Who can write what".
"""

from __future__ import annotations

import json

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.bundling import agent_wheel
from stacks.constants import (
    CLOUDWATCH_AGENT_CONFIG,
    CLOUDWATCH_AGENT_PARAMETER,
    EC2_LOG_RETENTION,
    INSTANCE_STREAMS,
)
from stallwatch.core.contract import CWAGENT_NAMESPACE, NAMESPACE


class Ec2Training(Construct):
    """The EC2 log group (`log_group`), the agent configuration (`agent_config`), the wheel (`wheel`) and the
    instance-role managed policy (`policy`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        deployment: str,
        log_group: str,
        bundle_dependencies: bool = True,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group_name = log_group
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=log_group,
            retention=EC2_LOG_RETENTION,
            removal_policy=RemovalPolicy.RETAIN,  # the training runs' logs outlive the watchdog
        )
        self.agent_config = ssm.StringParameter(
            self,
            "AgentConfig",
            parameter_name=CLOUDWATCH_AGENT_PARAMETER.format(deployment=deployment),
            string_value=json.dumps(cloudwatch_agent_config(log_group), separators=(",", ":")),
            description="Stallwatch: the CloudWatch agent's configuration for EC2 training nodes (deploy/ec2)",
            tier=ssm.ParameterTier.STANDARD,
        )
        self.wheel = agent_wheel(self, "AgentWheel", bundle_dependencies=bundle_dependencies)
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="Stallwatch on EC2 training instances: GPU and training metrics, training logs, the "
            "CloudWatch agent's configuration and the trainer-agent wheel",
            statements=[
                self._build_metrics(),
                *self._build_logs(),
                self._build_config(),
                self._build_wheel(),
            ],
        )

    def _build_metrics(self) -> iam.PolicyStatement:
        # PutMetricData has no resource-level permissions; the namespace condition keeps it to the two it needs.
        return iam.PolicyStatement(
            sid="PublishTrainingMetrics",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": [NAMESPACE, CWAGENT_NAMESPACE]}},
        )

    def _build_logs(self) -> list[iam.PolicyStatement]:
        # The group exists (this construct): the agent lists its streams, creates its own and writes to it, its name
        # the instance's id (CreateLogStream and PutLogEvents are on the log-stream resource, DescribeLogStreams on
        # the group's).
        stack = Stack.of(self)
        statements = [
            iam.PolicyStatement(
                sid="ListTrainingLogStreams",
                actions=["logs:DescribeLogStreams"],
                resources=log_group_arns(stack, self.log_group_name),
            ),
            iam.PolicyStatement(
                sid="ShipTrainingLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=log_stream_arns(stack, self.log_group_name, INSTANCE_STREAMS),
            ),
        ]
        return statements

    def _build_config(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid="ReadAgentConfig", actions=["ssm:GetParameter"], resources=[self.agent_config.parameter_arn]
        )

    def _build_wheel(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid="ReadAgentWheel",
            actions=["s3:GetObject"],
            resources=[self.wheel.bucket.arn_for_objects(self.wheel.s3_object_key)],
        )


def cloudwatch_agent_config(log_group: str) -> dict:
    """deploy/ec2/cloudwatch-agent.json, shipping the training logs to `log_group`."""
    config = json.loads(CLOUDWATCH_AGENT_CONFIG.read_text(encoding="utf-8"))
    for collected in config["logs"]["logs_collected"]["files"]["collect_list"]:
        collected["log_group_name"] = log_group
    return config


def log_stream_arns(stack: Stack, log_group: str, streams: str) -> list[str]:
    """The streams named `streams` (a pattern) of the EC2 log group and of the groups under it."""
    return [log_stream_arn(stack, name, streams) for name in (log_group, f"{log_group.rstrip('/')}/*")]


def log_stream_arn(stack: Stack, log_group: str, streams: str) -> str:
    return stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=f"{log_group}:log-stream:{streams}",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


def log_group_arns(stack: Stack, log_group: str) -> list[str]:
    """The EC2 log group and the groups under it (a job's `stallwatch:log-group` tag may name one), with streams."""
    return [
        stack.format_arn(
            service="logs", resource="log-group", resource_name=f"{name}:*", arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        for name in (log_group, f"{log_group.rstrip('/')}/*")
    ]
