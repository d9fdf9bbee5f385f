"""AWS Health's EC2 scheduled events: the EventBridge rule and the function that tells the jobs on the instances they
name (`on_health_event`, `runtime.health`).

The rule takes "AWS Health Event"s of EC2's scheduled changes only (retirements, stops, reboots, maintenance of an
instance); EventBridge retries a failed delivery and then sends it to the dead-letter queue, as for the watchdog's
rules. The function only reads (the running jobs, their checkpoint lines) and writes its table items and Slack: the
moves of the jobs that opted in are the sweeper's, under its grants (recovery in place, Slurm's requeue).

    health = HostEventsConstruct(self, "HealthEvents", code=code, config=config, table=table, slack_secret=secret,
                                 statements=permissions.host_events(), log_groups=groups, dead_letter_queue=dlq,
                                 service=deployment)
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_dynamodb import ITable
from constructs import Construct

from stacks.constants import (
    EVENT_RETRY_ATTEMPTS,
    LAMBDA_ARCHITECTURE,
    LAMBDA_LOG_RETENTION,
    LAMBDA_MEMORY_MB,
    LAMBDA_RUNTIME,
    ON_HEALTH_EVENT_HANDLER,
    ON_HEALTH_EVENT_TIMEOUT,
)
from stacks.nag import arn_template
from stallwatch.core.config import CONFIG_ENV, StallwatchConfig
from stallwatch.core.contract import (
    HEALTH_EVENT_DETAIL_TYPE,
    HEALTH_EVENT_SERVICE,
    HEALTH_EVENT_SOURCE,
    HEALTH_SCHEDULED_CATEGORY,
    SERVICE,
)

DESCRIPTION = "Stallwatch: tells the jobs on an instance AWS Health scheduled a change for, and plans their moves"
# The items the function touches (aws.host_events, the store's audit records, a Slack post kept for the sweeper, the
# Slurm jobs it lists): by partition key.
TABLE_ACTIONS = [
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:ConditionCheckItem",
]
TABLE_LEADING_KEYS = ["job#*", "host-move", "pending-post", "slurm-running"]


class HostEventsConstruct(Construct):
    """The rule (`rule`) and its function (`function`, its own least-privilege role)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        code: lambda_.Code,
        config: StallwatchConfig,
        table: ITable,
        slack_secret: secretsmanager.ISecret,
        statements: Sequence[iam.PolicyStatement],
        log_groups: Sequence[str],
        dead_letter_queue: sqs.IQueue,
        service: str = SERVICE,
    ) -> None:
        """`statements`: what finding the jobs and reading their logs needs (`WatchdogPermissions.host_events`), the
        logs of `log_groups` (the platforms' whose hosts are instances)."""
        super().__init__(scope, construct_id)
        self.role = self._build_role(table, slack_secret, statements)
        self.function = self._build_function(code, config, table, slack_secret, dead_letter_queue, service)
        self.rule = self._build_rule(dead_letter_queue)
        self._acknowledge_nag_findings(log_groups)

    def _build_role(
        self, table: ITable, slack_secret: secretsmanager.ISecret, statements: Sequence[iam.PolicyStatement]
    ) -> iam.Role:
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=DESCRIPTION)
        role.add_to_policy(
            iam.PolicyStatement(
                sid="NoticesMovesAndAudit",
                actions=TABLE_ACTIONS,
                resources=[table.table_arn],
                conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": TABLE_LEADING_KEYS}},
            )
        )
        for statement in statements:
            role.add_to_policy(statement)
        slack_secret.grant_read(role)
        return role

    def _build_function(
        self,
        code: lambda_.Code,
        config: StallwatchConfig,
        table: ITable,
        slack_secret: secretsmanager.ISecret,
        dead_letter_queue: sqs.IQueue,
        service: str,
    ) -> lambda_.Function:
        log_group = logs.LogGroup(self, "Logs", retention=LAMBDA_LOG_RETENTION)
        log_group.grant_write(self.role)
        return lambda_.Function(
            self,
            "Function",
            description=DESCRIPTION,
            code=code,
            handler=ON_HEALTH_EVENT_HANDLER,
            runtime=LAMBDA_RUNTIME,
            architecture=LAMBDA_ARCHITECTURE,
            memory_size=LAMBDA_MEMORY_MB,
            timeout=ON_HEALTH_EVENT_TIMEOUT,
            role=self.role,
            log_group=log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            tracing=lambda_.Tracing.ACTIVE,
            dead_letter_queue=dead_letter_queue,  # invoked asynchronously by EventBridge
            environment={
                CONFIG_ENV: config.model_dump_json(),
                "TABLE_NAME": table.table_name,
                "SLACK_SECRET_ARN": slack_secret.secret_arn,
                "POWERTOOLS_SERVICE_NAME": service,
            },
        )

    def _build_rule(self, dead_letter_queue: sqs.IQueue) -> events.Rule:
        return events.Rule(
            self,
            "Rule",
            description="Stallwatch: AWS Health's scheduled changes of EC2 instances",
            event_pattern=events.EventPattern(
                source=[HEALTH_EVENT_SOURCE],
                detail_type=[HEALTH_EVENT_DETAIL_TYPE],
                detail={"service": [HEALTH_EVENT_SERVICE], "eventTypeCategory": [HEALTH_SCHEDULED_CATEGORY]},
            ),
            targets=[
                targets.LambdaFunction(
                    self.function, dead_letter_queue=dead_letter_queue, retry_attempts=EVENT_RETRY_ATTEMPTS
                )
            ],
        )

    def _acknowledge_nag_findings(self, groups: Sequence[str]) -> None:
        """The wildcards this function's role keeps, and why."""
        arn = arn_template(Stack.of(self))
        reasons = {
            "*": "X-Ray tracing and ec2:DescribeInstances support no resource-level permissions; DescribeInstances is "
            "conditioned on aws:RequestedRegion",
            **{
                arn.format(service="logs", resource=f"log-group:{group}:*"): "read-only: each training node's "
                "CloudWatch agent writes its own stream, named at run time; only checkpoint lines are read"
                for group in groups
            },
        }
        Validations.of(self).acknowledge(
            *(
                Acknowledgment(id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{resource}]", reason=reason)
                for resource, reason in reasons.items()
            ),
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-L1",
                reason=f"pinned to {LAMBDA_RUNTIME.name} like the watchdog: the bundled wheels are built for it "
                "(stacks/constants.py); upgrade the runtime and the bundle together",
            ),
        )
