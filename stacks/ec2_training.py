"""What the EC2 training instances need: one customer managed policy to attach to their instance role.

The CloudWatch agent (deploy/ec2/cloudwatch-agent.json) publishes the per-instance GPU metrics in ``CWAgent`` and
ships the training logs to the EC2 log group (streams named by instance id); the trainer_agent publishes its metrics
in ``Stallwatch``. Nothing else: no EC2, SageMaker or alarm permissions.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from stallwatch.core.contract import CWAGENT_NAMESPACE, NAMESPACE


class Ec2TrainingPolicy(Construct):
    """The instance-role managed policy (`policy`) for EC2 training instances."""

    def __init__(self, scope: Construct, construct_id: str, *, log_group: str) -> None:
        super().__init__(scope, construct_id)
        self.log_group = log_group
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="Stallwatch on EC2 training instances: GPU and training metrics, training logs",
            statements=[self._build_metrics(), self._build_logs()],
        )

    def _build_metrics(self) -> iam.PolicyStatement:
        # PutMetricData has no resource-level permissions; the namespace condition keeps it to the two it needs.
        return iam.PolicyStatement(
            sid="PublishTrainingMetrics",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": [NAMESPACE, CWAGENT_NAMESPACE]}},
        )

    def _build_logs(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid="ShipTrainingLogs",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
            resources=log_group_arns(Stack.of(self), self.log_group),
        )


def log_group_arns(stack: Stack, log_group: str) -> list[str]:
    """The EC2 log group and the groups under it (a job's `stallwatch:log-group` tag may name one), with streams."""
    return [
        stack.format_arn(
            service="logs", resource="log-group", resource_name=f"{name}:*", arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        for name in (log_group, f"{log_group.rstrip('/')}/*")
    ]
