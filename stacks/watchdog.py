"""The control plane: four functions on one asset, their dead-letter queue, and what invokes them.

- `on_job_state`: each watched platform's state changes (EventBridge, `PlatformStack.state_rule`) -> create or delete
  a job's alarms;
- `on_alarm`: the alarms' Lambda action (principal lambda.alarms.cloudwatch.amazonaws.com) -> decide, act;
- `sweeper`: every `sweeper_minutes` -> reconcile alarms, publish log idleness, decide;
- `on_log_line`: a fatal line in a training log group (the subscription filters, `log_subscriptions.py`) -> decide.

The Slack buttons' function shares the asset (`code`) but is its own construct (`slack_endpoint.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_dynamodb import ITable
from constructs import Construct

from stacks.bundling import lambda_code
from stacks.constants import (
    ALARM_ACTION_PRINCIPAL,
    DLQ_RETENTION,
    EVENT_RETRY_ATTEMPTS,
    LAMBDA_ARCHITECTURE,
    LAMBDA_LOG_RETENTION,
    LAMBDA_MEMORY_MB,
    LAMBDA_RUNTIME,
    ON_ALARM_HANDLER,
    ON_ALARM_TIMEOUT,
    ON_JOB_STATE_HANDLER,
    ON_JOB_STATE_TIMEOUT,
    ON_LOG_LINE_HANDLER,
    ON_LOG_LINE_TIMEOUT,
    SWEEPER_HANDLER,
    SWEEPER_TIMEOUT,
)
from stacks.permissions import WatchdogPermissions
from stacks.platforms.base import PlatformStack
from stallwatch.core.config import CONFIG_ENV, StallwatchConfig
from stallwatch.core.contract import SERVICE


@dataclass(frozen=True)
class FunctionSpec:
    """What differs between the four functions."""

    construct_id: str
    handler: str
    timeout: Duration
    description: str


ON_JOB_STATE = FunctionSpec(
    "OnJobState", ON_JOB_STATE_HANDLER, ON_JOB_STATE_TIMEOUT, "Stallwatch: creates and deletes a job's alarms"
)
ON_ALARM = FunctionSpec("OnAlarm", ON_ALARM_HANDLER, ON_ALARM_TIMEOUT, "Stallwatch: decides and acts on a job's alarm")
SWEEPER = FunctionSpec("Sweeper", SWEEPER_HANDLER, SWEEPER_TIMEOUT, "Stallwatch: periodic reconcile and decide")
ON_LOG_LINE = FunctionSpec(
    "OnLogLine", ON_LOG_LINE_HANDLER, ON_LOG_LINE_TIMEOUT, "Stallwatch: decides on a job whose log shows a fatal line"
)


class Watchdog(Construct):
    """The four functions (least-privilege roles, DLQ, X-Ray) and their triggers; `code` is the shared asset."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StallwatchConfig,
        table: ITable,
        slack_secret: secretsmanager.ISecret,
        bundle_dependencies: bool,
        platforms: list[PlatformStack],
        service: str = SERVICE,
    ) -> None:
        """`platforms`: the watched platforms' parts (their grants and rules); `service` (the deployment's name) is
        the `service` dimension of the control plane's metrics."""
        super().__init__(scope, construct_id)
        self.service = service
        self.config = config
        self.table = table
        self.slack_secret = slack_secret
        self.platforms = platforms
        self.permissions = WatchdogPermissions(Stack.of(self), config, platforms)
        self.code = lambda_code(bundle_dependencies=bundle_dependencies)
        self.dead_letter_queue = self._build_dead_letter_queue()
        self.on_alarm = self._build_function(ON_ALARM, self.permissions.on_alarm())
        self.on_job_state = self._build_function(
            ON_JOB_STATE, self.permissions.on_job_state(), ALARM_ACTION_ARN=self.on_alarm.function_arn
        )
        self.sweeper = self._build_function(
            SWEEPER, self.permissions.sweeper(), ALARM_ACTION_ARN=self.on_alarm.function_arn
        )
        self.on_log_line = self._build_function(
            ON_LOG_LINE, self.permissions.on_log_line(), ALARM_ACTION_ARN=self.on_alarm.function_arn
        )
        self.functions = [self.on_job_state, self.on_alarm, self.sweeper, self.on_log_line]
        self.deciders = [self.on_alarm, self.sweeper, self.on_log_line]  # decide and schedule rechecks
        self._build_alarm_action_permission()
        self.rules = self._build_rules()

    def _build_dead_letter_queue(self) -> sqs.Queue:
        return sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=DLQ_RETENTION,
        )

    def _build_function(
        self, spec: FunctionSpec, statements: list[iam.PolicyStatement], **extra_env: str
    ) -> lambda_.Function:
        log_group = logs.LogGroup(self, f"{spec.construct_id}Logs", retention=LAMBDA_LOG_RETENTION)
        # An own role, without the AWSLambdaBasicExecutionRole managed policy: logs only to its own group.
        role = iam.Role(
            self,
            f"{spec.construct_id}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=spec.description,
        )
        for statement in statements:
            role.add_to_policy(statement)
        log_group.grant_write(role)
        function = lambda_.Function(
            self,
            spec.construct_id,
            description=spec.description,
            code=self.code,
            handler=spec.handler,
            runtime=LAMBDA_RUNTIME,
            architecture=LAMBDA_ARCHITECTURE,
            memory_size=LAMBDA_MEMORY_MB,
            timeout=spec.timeout,
            role=role,
            log_group=log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            tracing=lambda_.Tracing.ACTIVE,
            dead_letter_queue=self.dead_letter_queue,  # all four are invoked asynchronously
            environment={
                CONFIG_ENV: self.config.model_dump_json(),
                "TABLE_NAME": self.table.table_name,
                "SLACK_SECRET_ARN": self.slack_secret.secret_arn,
                "POWERTOOLS_SERVICE_NAME": self.service,
                **extra_env,
            },
        )
        self.table.grant_read_write_data(role)
        self.slack_secret.grant_read(role)
        return function

    def _build_alarm_action_permission(self) -> None:
        """Only this deployment's alarms (by name prefix), in this account, may invoke `on_alarm`."""
        stack = Stack.of(self)
        self.on_alarm.add_permission(
            "AlarmAction",
            principal=iam.ServicePrincipal(ALARM_ACTION_PRINCIPAL),
            action="lambda:InvokeFunction",
            source_account=stack.account,
            source_arn=self.permissions.alarm_arn(f"{self.config.alarm_prefix}*"),
        )

    def _build_rules(self) -> list[events.Rule]:
        """Each watched platform's state-change events to on_job_state, and the sweeper's schedule."""
        rules = [
            self._rule_to(
                self.on_job_state, rule.construct_id, event_pattern=rule.pattern, description=rule.description
            )
            for platform in self.platforms
            if (rule := platform.state_rule()) is not None
        ]
        rules.append(
            self._rule_to(
                self.sweeper,
                "SweeperSchedule",
                schedule=events.Schedule.rate(Duration.minutes(self.config.sweeper_minutes)),
                description=f"Stallwatch: sweep every {self.config.sweeper_minutes} minutes",
            )
        )
        return rules

    def _rule_to(
        self,
        function: lambda_.IFunction,
        construct_id: str,
        *,
        description: str,
        event_pattern: events.EventPattern | None = None,
        schedule: events.Schedule | None = None,
    ) -> events.Rule:
        return events.Rule(
            self,
            construct_id,
            description=description,
            event_pattern=event_pattern,
            schedule=schedule,
            targets=[
                targets.LambdaFunction(
                    function, dead_letter_queue=self.dead_letter_queue, retry_attempts=EVENT_RETRY_ATTEMPTS
                )
            ],
        )
