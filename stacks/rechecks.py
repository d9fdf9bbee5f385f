"""Rechecks: one-time EventBridge Scheduler schedules that decide a job again when the engine said its evidence
turns decisive (`Decision.recheck_at`), rather than at the next sweep.

- the schedule group (`<deployment>-rechecks`) the schedules live in, deleted with the stack;
- the role Scheduler assumes (only for this account's group): invoke on_alarm, and put a recheck it could not
  deliver in the dead-letter queue;
- for the functions that decide (on_alarm, the sweeper): the group, the role and the queue in their environment,
  CreateSchedule/UpdateSchedule/DeleteSchedule on the group's schedules only, and iam:PassRole of that role to
  Scheduler only.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.nag import arn_template

SCHEDULER_SERVICE = "scheduler.amazonaws.com"
GROUP_SUFFIX = "-rechecks"
# The functions' environment, as `stallwatch.runtime.environment.LambdaEnvironment` names it (tests/stacks check).
GROUP_ENV = "RECHECK_SCHEDULE_GROUP"
ROLE_ENV = "RECHECK_ROLE_ARN"
DEAD_LETTER_ENV = "RECHECK_DEAD_LETTER_ARN"
SCHEDULE_ACTIONS = ["scheduler:CreateSchedule", "scheduler:UpdateSchedule", "scheduler:DeleteSchedule"]


class Rechecks(Construct):
    """The schedule group, Scheduler's role, and the deciding functions' environment and grants; `nag_findings`
    names the one wildcard left (the group's schedules, named at run time) and why it stays."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        deployment: str,
        target: lambda_.IFunction,
        dead_letter_queue: sqs.IQueue,
        deciders: list[lambda_.Function],
    ) -> None:
        """`target` (on_alarm) is what the schedules invoke; `deciders` the functions that schedule them."""
        super().__init__(scope, construct_id)
        self.stack = Stack.of(self)
        self.group_name = f"{deployment}{GROUP_SUFFIX}"
        self.group = scheduler.ScheduleGroup(
            self, "Group", schedule_group_name=self.group_name, removal_policy=RemovalPolicy.DESTROY
        )
        self.role = self._build_role(target, dead_letter_queue)
        schedules = self._schedules_arn()
        for function in deciders:
            self._grant(function, schedules, dead_letter_queue)
        self.nag_findings = {
            arn_template(self.stack).format(service="scheduler", resource=f"schedule/{self.group_name}/*"): (
                "scheduler:CreateSchedule/UpdateSchedule/DeleteSchedule of this deployment's recheck group only: one "
                "schedule per job, named at run time"
            )
        }

    def _build_role(self, target: lambda_.IFunction, dead_letter_queue: sqs.IQueue) -> iam.Role:
        """Assumed by Scheduler for this account's recheck group only (the confused-deputy conditions)."""
        principal = iam.ServicePrincipal(SCHEDULER_SERVICE).with_conditions(
            {
                "StringEquals": {
                    "aws:SourceAccount": self.stack.account,
                    "aws:SourceArn": self.group.schedule_group_arn,
                }
            }
        )
        role = iam.Role(self, "SchedulerRole", assumed_by=principal, description="Stallwatch: rechecks invoke on_alarm")
        role.add_to_policy(
            iam.PolicyStatement(sid="InvokeOnAlarm", actions=["lambda:InvokeFunction"], resources=[target.function_arn])
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="UndeliveredRechecks", actions=["sqs:SendMessage"], resources=[dead_letter_queue.queue_arn]
            )
        )
        return role

    def _schedules_arn(self) -> str:
        return self.stack.format_arn(service="scheduler", resource="schedule", resource_name=f"{self.group_name}/*")

    def _grant(self, function: lambda_.Function, schedules: str, dead_letter_queue: sqs.IQueue) -> None:
        function.add_environment(GROUP_ENV, self.group.schedule_group_name)
        function.add_environment(ROLE_ENV, self.role.role_arn)
        function.add_environment(DEAD_LETTER_ENV, dead_letter_queue.queue_arn)
        function.add_to_role_policy(
            iam.PolicyStatement(sid="ScheduleRechecks", actions=SCHEDULE_ACTIONS, resources=[schedules])
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                sid="PassRecheckRole",
                actions=["iam:PassRole"],
                resources=[self.role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": SCHEDULER_SERVICE}},
            )
        )
