"""SageMaker's part of the stack: reading, stopping and resuming training jobs, the rule of their state changes, the
sweeper's listing, and the fatal-line subscription of `/aws/sagemaker/TrainingJobs`.

That group is shared by every training job of the account and absent until the first job, so a custom resource
(`Custom::FatalLineSubscription`, `handlers.log_subscription`) creates it if absent and puts our filter where one of
its two slots is free, never removing another (docs/deploy.md says what to do otherwise). Its function and the
resource sit under the subscriptions' construct (`LogSubscriptions/...`), where they always were.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, ArnFormat, CustomResource, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

from stacks.constants import (
    LAMBDA_ARCHITECTURE,
    LAMBDA_LOG_RETENTION,
    LAMBDA_MEMORY_MB,
    LAMBDA_RUNTIME,
    LOG_SUBSCRIPTION_HANDLER,
    LOG_SUBSCRIPTION_TIMEOUT,
)
from stacks.log_subscriptions import FatalLineSubscriptions
from stacks.nag import arn_template
from stacks.platforms.base import PlatformStack, StateRule, Wiring, in_this_region, state_rule, stop_scope
from stallwatch.core.contract import SAGEMAKER_LOG_GROUP

# Resume (see docs/resume.md). Mirrors stallwatch.core.resume, which stacks may not import: the opt-in tag on the
# job and the role, and the tag every job Stallwatch creates carries.
RESUME_TAG = "stallwatch:resume"
RESUMED_FROM_TAG = "stallwatch:resumed-from"
SAGEMAKER_SERVICE = "sagemaker.amazonaws.com"
STOP_TRAINING_JOB = "sagemaker:StopTrainingJob"
CUSTOM_RESOURCE_TYPE = "Custom::FatalLineSubscription"
SUBSCRIPTION_ACTIONS = [
    "logs:CreateLogGroup",
    "logs:DescribeSubscriptionFilters",
    "logs:PutSubscriptionFilter",
    "logs:DeleteSubscriptionFilter",
]


class SageMakerStack(PlatformStack):
    """SageMaker training jobs; `subscriber` and `subscription`: the custom resource's function and the resource,
    where `platforms.sagemaker.log_subscription` asks for them."""

    name = "sagemaker"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subscriber: lambda_.Function | None = None
        self.subscription: CustomResource | None = None

    def read_jobs(self) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="ReadTrainingJobs",
                actions=["sagemaker:DescribeTrainingJob", "sagemaker:ListTags"],
                resources=[self._training_jobs_arn()],
            )
        ]

    def read_logs(self) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="ReadTrainingJobLogs", actions=["logs:FilterLogEvents"], resources=[self._training_log_group()]
            )
        ]

    def stop(self, conditions: dict[str, Any] | None) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="StopTrainingJobs",
                actions=[STOP_TRAINING_JOB],
                resources=[self._training_jobs_arn()],
                conditions=conditions,
            )
        ]

    def resume(self) -> list[iam.PolicyStatement]:
        """CreateTrainingJob (and AddTags, which CreateTrainingJob with tags needs) only of a job that carries the
        resume chain's tag; iam:PassRole only to SageMaker and only of roles tagged `stallwatch:resume`, so a job's
        role must be opted in as well as the job."""
        return [
            iam.PolicyStatement(
                sid="CreateResumedTrainingJobs",
                actions=["sagemaker:CreateTrainingJob", "sagemaker:AddTags"],
                resources=[self._training_jobs_arn()],
                conditions={"Null": {f"aws:RequestTag/{RESUMED_FROM_TAG}": "false"}},
            ),
            iam.PolicyStatement(
                sid="PassResumeOptedInRoles",
                actions=["iam:PassRole"],
                resources=[self.stack.format_arn(service="iam", region="", resource="role", resource_name="*")],
                conditions={
                    "StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE},
                    "Null": {f"aws:ResourceTag/{RESUME_TAG}": "false"},
                },
            ),
        ]

    def sweep(self) -> list[iam.PolicyStatement]:
        """The listing of running jobs, and one Logs Insights query a sweep (each host's newest line): started on,
        and its results read from, the training log group (the Service Authorization Reference gives both the
        log-group resource type)."""
        return [
            in_this_region("ListTrainingJobs", ["sagemaker:ListTrainingJobs"]),
            iam.PolicyStatement(
                sid="QueryTrainingJobLogs",
                actions=["logs:StartQuery", "logs:GetQueryResults"],
                resources=[self._training_log_group()],
            ),
        ]

    def state_rule(self) -> StateRule:
        return state_rule(
            "SageMakerJobState",
            "aws.sagemaker",
            "SageMaker Training Job State Change",
            "Stallwatch: SageMaker training job state changes",
        )

    def build(self, wiring: Wiring) -> None:
        if self.settings.log_subscription:
            self.subscriber = self._build_subscriber(wiring.subscriptions, wiring.code, wiring.deployment)
            self.subscription = self._build_subscription(wiring.subscriptions, self.subscriber)

    def watchdog_findings(self, arn: str) -> dict[str, str]:
        return {
            arn.format(service="sagemaker", resource="training-job/*"): "jobs are created after deploy by anyone; "
            f"Stallwatch reads every training job of this account and region, and {stop_scope(self.config)}",
            arn.format(service="logs", resource=f"log-group:{SAGEMAKER_LOG_GROUP}:*"): "read-only: SageMaker writes "
            "one log stream per host and job into this group; the streams are named at run time",
            arn_template(self.stack, regional=False).format(
                service="iam", resource="role/*"
            ): "iam:PassRole to sagemaker.amazonaws.com only, and only of roles tagged stallwatch:resume (the "
            "training roles of jobs that opted in to resume; see docs/resume.md)",
        }

    def _build_subscriber(
        self, subscriptions: FatalLineSubscriptions, code: lambda_.Code, deployment: str
    ) -> lambda_.Function:
        """The custom resource's function: its own role, the SageMaker group's subscription calls only."""
        description = "Stallwatch: this deployment's fatal-line subscription on SageMaker's log group"
        role = iam.Role(
            subscriptions,
            "SubscriberRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=description,
        )
        group = SAGEMAKER_LOG_GROUP
        role.add_to_policy(
            iam.PolicyStatement(
                sid="SubscribeSageMakerLogGroup",
                actions=SUBSCRIPTION_ACTIONS,
                resources=[subscriptions.group_arn(group), subscriptions.group_arn(group, streams=True)],
            )
        )
        log_group = logs.LogGroup(subscriptions, "SubscriberLogs", retention=LAMBDA_LOG_RETENTION)
        log_group.grant_write(role)
        function = lambda_.Function(
            subscriptions,
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
        group_arn = arn_template(self.stack).format(service="logs", resource=f"log-group:{group}:*")
        Validations.of(subscriptions).acknowledge(
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

    def _build_subscription(
        self, subscriptions: FatalLineSubscriptions, subscriber: lambda_.Function
    ) -> CustomResource:
        permission = subscriptions.permission("SageMakerFatalLines", SAGEMAKER_LOG_GROUP)
        subscription = CustomResource(
            subscriptions,
            "SageMaker",
            service_token=subscriber.function_arn,
            resource_type=CUSTOM_RESOURCE_TYPE,
            properties={
                "LogGroupName": SAGEMAKER_LOG_GROUP,
                "FilterName": subscriptions.filter_name,
                "FilterPattern": subscriptions.pattern,
                "DestinationArn": subscriptions.destination.function_arn,
            },
        )
        subscription.node.add_dependency(permission)
        return subscription

    def _training_jobs_arn(self) -> str:
        return self.stack.format_arn(service="sagemaker", resource="training-job", resource_name="*")

    def _training_log_group(self) -> str:
        return self.stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{SAGEMAKER_LOG_GROUP}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )


PART = SageMakerStack
