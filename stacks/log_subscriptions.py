"""Fatal lines wake the engine: subscription filters that send the training log groups' fatal lines to on_log_line.

Each watched platform subscribes its group where `platforms.<name>.log_subscription` asks (`stacks.platforms`): a group
the stack owns (EC2's, Slurm's) with an `AWS::Logs::SubscriptionFilter` (`subscribe`); SageMaker's shared group with a
custom resource of its own (`stacks.platforms.sagemaker`). For each group, a Lambda permission lets CloudWatch Logs
invoke on_log_line for that group of this account only (SourceArn, SourceAccount), in place before the filter
(PutSubscriptionFilter checks it).

Each filter is named `<deployment>-fatal-lines` and holds `Policy.fatal_filter_pattern` (the built-in fatal lines and
the deployment's own).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.constants import LOGS_PRINCIPAL
from stallwatch.core.config import FATAL_LINES_FILTER, StallwatchConfig


class FatalLineSubscriptions(Construct):
    """The subscription filters to `destination` of the groups the platforms subscribe (`subscribe`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        deployment: str,
        config: StallwatchConfig,
        destination: lambda_.Function,
    ) -> None:
        super().__init__(scope, construct_id)
        self.stack = Stack.of(self)
        self.destination = destination
        self.filter_name = FATAL_LINES_FILTER.format(deployment=deployment)
        self.pattern = config.policy.fatal_filter_pattern

    def permission(self, construct_id: str, group: str) -> lambda_.CfnPermission:
        """CloudWatch Logs may invoke the destination for `group` of this account only."""
        return lambda_.CfnPermission(
            self,
            construct_id,
            action="lambda:InvokeFunction",
            function_name=self.destination.function_arn,
            principal=LOGS_PRINCIPAL,
            source_account=self.stack.account,
            source_arn=self.group_arn(group, streams=True),
        )

    def subscribe(self, construct_id: str, group: logs.ILogGroup, name: str) -> logs.CfnSubscriptionFilter:
        """The filter on `group` (one of the stack's, named `name`): created after it, deleted before it."""
        permission = self.permission(f"{construct_id}FatalLines", name)
        subscription = logs.CfnSubscriptionFilter(
            self,
            construct_id,
            log_group_name=group.log_group_name,
            filter_name=self.filter_name,
            filter_pattern=self.pattern,
            destination_arn=self.destination.function_arn,
        )
        subscription.add_resource_dependency(permission)
        return subscription

    def group_arn(self, group: str, streams: bool = False) -> str:
        """A log group's ARN as IAM and CloudWatch Logs name it (`streams`: with its streams, `:*`)."""
        return self.stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{group}:*" if streams else group,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
