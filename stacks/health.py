"""Alarms on the control plane itself: function errors and throttles, failed stops and Slack posts, and anything
in the dead-letter queue.

Each is named ``<alarm_prefix>health-<what>`` (`StallwatchConfig.health_alarm_prefix`), so that the topic's and the
key's grants to CloudWatch name this deployment's health alarms alone (`health_alarm_arns`)."""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.constants import HEALTH_ALARM_PERIOD
from stallwatch.core.contract import (
    CONTROL_PLANE_NAMESPACE,
    OPERATOR_ACTIONS_FAILED,
    RECHECK_SCHEDULE_FAILURES,
    RESUME_FAILURES,
    SERVICE,
    SLACK_FAILURES,
    STOP_FAILURES,
)


def health_alarm_arns(stack: Stack, name_prefix: str) -> str:
    """The ARNs of the health alarms named `name_prefix`..., as one wildcard ARN (an `aws:SourceArn` for ArnLike)."""
    return stack.format_arn(
        service="cloudwatch",
        resource="alarm",
        resource_name=f"{name_prefix}*",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class ControlPlaneHealth(Construct):
    """One alarm per function for errors and for throttles, one per function with an on-failure destination
    (`destinations`) for records it could not deliver there, one each on failed stops, Slack posts, resumes, rechecks
    and presses (the watchdog's own metrics), one on DLQ depth; all notify `topic`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: list[lambda_.Function],
        destinations: list[lambda_.Function],
        dead_letter_queue: sqs.IQueue,
        topic: sns.ITopic,
        name_prefix: str,
        service: str = SERVICE,
    ) -> None:
        """`service` is the deployment's name: the `service` dimension its functions publish their metrics under;
        `name_prefix` what the alarms' names start with (`StallwatchConfig.health_alarm_prefix`)."""
        super().__init__(scope, construct_id)
        self.service = service
        self.name_prefix = name_prefix
        self.action = actions.SnsAction(topic)
        self.alarms: list[cloudwatch.Alarm] = []
        for function in functions:
            self._build_function_alarms(function)
        for function in destinations:
            self._build_destination_alarm(function)
        self._build_failure_alarms()
        self._build_dead_letter_alarm(dead_letter_queue)

    @staticmethod
    def _label(function: lambda_.Function) -> str:
        """The function's construct id, or its construct's where that id says nothing ("Function")."""
        node = function.node
        return node.scope.node.id if node.id == "Function" and node.scope is not None else node.id

    def _build_function_alarms(self, function: lambda_.Function) -> None:
        name = self._label(function)
        self._alarm(f"{name}Errors", function.metric_errors(period=HEALTH_ALARM_PERIOD), f"Stallwatch {name} failed")
        self._alarm(
            f"{name}Throttles", function.metric_throttles(period=HEALTH_ALARM_PERIOD), f"Stallwatch {name} throttled"
        )

    def _build_destination_alarm(self, function: lambda_.Function) -> None:
        """A failed asynchronous invocation Lambda could not hand to its on-failure destination is lost."""
        name = self._label(function)
        metric = function.metric("DestinationDeliveryFailures", period=HEALTH_ALARM_PERIOD, statistic="Sum")
        self._alarm(f"{name}DestinationDeliveryFailures", metric, f"Stallwatch {name}: a failed invocation was lost")

    def _build_failure_alarms(self) -> None:
        for name, description in (
            (STOP_FAILURES, "Stallwatch could not stop a stalled job (the sweeper retries it)"),
            (SLACK_FAILURES, "Stallwatch could not post to Slack (check the Slack secret and app)"),
            (RESUME_FAILURES, "Stallwatch could not resume a stopped run (is its role tagged stallwatch:resume?)"),
            (
                RECHECK_SCHEDULE_FAILURES,
                "Stallwatch could not schedule a recheck (EventBridge Scheduler): the sweeper decides it, a sweep late",
            ),
            (
                OPERATOR_ACTIONS_FAILED,
                "A Slack button press could not be applied (posted back to its channel): see slack_interactions' logs",
            ),
        ):
            metric = cloudwatch.Metric(
                namespace=CONTROL_PLANE_NAMESPACE,
                metric_name=name,
                dimensions_map={"service": self.service},
                statistic=cloudwatch.Stats.SUM,
                period=HEALTH_ALARM_PERIOD,
            )
            self._alarm(name, metric, description)

    def _build_dead_letter_alarm(self, queue: sqs.IQueue) -> None:
        self._alarm(
            "DeadLetters",
            queue.metric_approximate_number_of_messages_visible(period=HEALTH_ALARM_PERIOD),
            "Stallwatch events or invocations were dropped into the dead-letter queue",
        )

    def _alarm(self, construct_id: str, metric: cloudwatch.IMetric, description: str) -> None:
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=f"{self.name_prefix}{construct_id}",
            metric=metric,
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        alarm.add_alarm_action(self.action)
        alarm.add_ok_action(self.action)
        self.alarms.append(alarm)
