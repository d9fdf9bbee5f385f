"""Fatal lines wake the engine: subscription filters that send the training log groups' fatal lines to on_log_line.

- the EC2 jobs' group and the Slurm jobs' (the stack's own, `Ec2Training`'s and `SlurmActions`'): an
  `AWS::Logs::SubscriptionFilter` each (`subscribe`);
- SageMaker's `/aws/sagemaker/TrainingJobs`, shared by every training job of the account, absent until the first
  job: a custom resource (`Custom::FatalLineSubscription`, `handlers.log_subscription`) creates it if absent and puts
  our filter where one of its two slots is free, never removing another (docs/deploy.md says what to do otherwise);
- for each group, a Lambda permission that lets CloudWatch Logs invoke on_log_line for that group of this account
  only (SourceArn, SourceAccount), in place before the filter (PutSubscriptionFilter checks it).

Each filter is named `<deployment>-fatal-lines` and holds `Policy.fatal_filter_pattern` (the built-in fatal lines and
the deployment's own).
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, ArnFormat, CustomResource, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.constants import (
    LAMBDA_ARCHITECTURE,
    LAMBDA_LOG_RETENTION,
    LAMBDA_MEMORY_MB,
    LAMBDA_RUNTIME,
    LOG_SUBSCRIPTION_HANDLER,
    LOG_SUBSCRIPTION_TIMEOUT,
    LOGS_PRINCIPAL,
)
from stacks.nag import arn_template
from stallwatch.core.config import FATAL_LINES_FILTER, StallwatchConfig
from stallwatch.core.contract import SAGEMAKER_LOG_GROUP

CUSTOM_RESOURCE_TYPE = "Custom::FatalLineSubscription"
SUBSCRIPTION_ACTIONS = [
    "logs:CreateLogGroup",
    "logs:DescribeSubscriptionFilters",
    "logs:PutSubscriptionFilter",
    "logs:DeleteSubscriptionFilter",
]


class FatalLineSubscriptions(Construct):
    """The subscription filters of the groups `config.log_subscriptions` names (of monitored platforms), to
    `destination`; `ec2_filter`, `sagemaker_subscription` and `subscriber` (the custom resource's function), where
    built."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        deployment: str,
        config: StallwatchConfig,
        destination: lambda_.Function,
        ec2_log_group: logs.ILogGroup,
        code: lambda_.Code,
    ) -> None:
        super().__init__(scope, construct_id)
        self.stack = Stack.of(self)
        self.destination = destination
        self.filter_name = FATAL_LINES_FILTER.format(deployment=deployment)
        self.pattern = config.policy.fatal_filter_pattern
        self.ec2_filter: logs.CfnSubscriptionFilter | None = None
        self.sagemaker_subscription: CustomResource | None = None
        self.subscriber: lambda_.Function | None = None
        wanted = config.log_subscriptions
        if wanted.ec2 and config.policy.monitor_ec2:
            self.ec2_filter = self.subscribe("Ec2", ec2_log_group, config.ec2_log_group)
        if wanted.sagemaker and config.policy.monitor_sagemaker:
            self.subscriber = self._build_subscriber(code, deployment)
            self.sagemaker_subscription = self._build_sagemaker_subscription(self.subscriber)

    def _build_permission(self, construct_id: str, group: str) -> lambda_.CfnPermission:
        """CloudWatch Logs may invoke the destination for `group` of this account only."""
        return lambda_.CfnPermission(
            self,
            construct_id,
            action="lambda:InvokeFunction",
            function_name=self.destination.function_arn,
            principal=LOGS_PRINCIPAL,
            source_account=self.stack.account,
            source_arn=self._group_arn(group, streams=True),
        )

    def subscribe(self, construct_id: str, group: logs.ILogGroup, name: str) -> logs.CfnSubscriptionFilter:
        """The filter on `group` (one of the stack's, named `name`): created after it, deleted before it."""
        permission = self._build_permission(f"{construct_id}FatalLines", name)
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

    def _build_subscriber(self, code: lambda_.Code, deployment: str) -> lambda_.Function:
        """The custom resource's function: its own role, the SageMaker group's subscription calls only."""
        description = "Stallwatch: this deployment's fatal-line subscription on SageMaker's log group"
        role = iam.Role(
            self, "SubscriberRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=description
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="SubscribeSageMakerLogGroup",
                actions=SUBSCRIPTION_ACTIONS,
                resources=[self._group_arn(SAGEMAKER_LOG_GROUP), self._group_arn(SAGEMAKER_LOG_GROUP, streams=True)],
            )
        )
        log_group = logs.LogGroup(self, "SubscriberLogs", retention=LAMBDA_LOG_RETENTION)
        log_group.grant_write(role)
        function = lambda_.Function(
            self,
            "Subscriber",
            description=description,
            code=code,
            handler=LOG_SUBSCRIPTION_HANDLER,
            runtime=LAMBDA_RUNTIME,
            architecture=LAMBDA_ARCHITECTURE,
            memory_size=LAMBDA_MEMORY_MB,
            timeout=LOG_SUBSCRIPTION_TIMEOUT,
            role=role,
            log_group=log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            environment={"POWERTOOLS_SERVICE_NAME": deployment},
        )
        group_arn = arn_template(self.stack).format(service="logs", resource=f"log-group:{SAGEMAKER_LOG_GROUP}:*")
        Validations.of(self).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{group_arn}]",
                reason="the subscription calls of SageMaker's one log group, which IAM names with its streams; the "
                "function deletes only the filter of this deployment's name and destination",
            ),
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-L1",
                reason=f"pinned to {LAMBDA_RUNTIME.name} with the other functions: they share one asset "
                "(stacks/constants.py)",
            ),
        )
        return function

    def _build_sagemaker_subscription(self, subscriber: lambda_.Function) -> CustomResource:
        permission = self._build_permission("SageMakerFatalLines", SAGEMAKER_LOG_GROUP)
        subscription = CustomResource(
            self,
            "SageMaker",
            service_token=subscriber.function_arn,
            resource_type=CUSTOM_RESOURCE_TYPE,
            properties={
                "LogGroupName": SAGEMAKER_LOG_GROUP,
                "FilterName": self.filter_name,
                "FilterPattern": self.pattern,
                "DestinationArn": self.destination.function_arn,
            },
        )
        subscription.node.add_dependency(permission)
        return subscription

    def _group_arn(self, group: str, streams: bool = False) -> str:
        """A log group's ARN as IAM and CloudWatch Logs name it (`streams`: with its streams, `:*`)."""
        return self.stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{group}:*" if streams else group,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
