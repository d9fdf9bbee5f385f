"""EC2's part of the stack: reading, stopping and starting (resuming) tagged instances, the rule of their state
changes, the fatal-line subscription of the deployment's EC2 log group, and recovery in place's documents
(`ec2_recovery.RecoverInPlace`).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_iam as iam

from stacks.ec2_training import log_group_arns
from stacks.platforms.base import PlatformStack, StateRule, Wiring, in_this_region, state_rule, stop_scope
from stacks.platforms.ec2_recovery import RecoverInPlace

# Mirrors stallwatch.core.resume's opt-in tag, which stacks may not import: StartInstances only of instances tagged so.
RESUME_TAG = "stallwatch:resume"
STOP_INSTANCES = "ec2:StopInstances"


class Ec2Stack(PlatformStack):
    """EC2 jobs; `recovery`: recovery in place's documents and grants, once built."""

    name = "ec2"
    instance_hosts = True

    def read_jobs(self) -> list[iam.PolicyStatement]:
        # DescribeInstances has no resource-level permissions.
        return [in_this_region("DescribeInstances", ["ec2:DescribeInstances"])]

    def read_logs(self) -> list[iam.PolicyStatement]:
        # Read by stream (instance id): the configured group and the groups under it, which a job's
        # stallwatch:log-group tag may name.
        groups = log_group_arns(self.stack, self.config.ec2_log_group)
        read = ["logs:DescribeLogStreams", "logs:FilterLogEvents"]
        return [iam.PolicyStatement(sid="ReadEc2TrainingLogs", actions=read, resources=groups)]

    def stop(self, conditions: dict[str, Any] | None) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="StopInstances", actions=[STOP_INSTANCES], resources=[self._instances()], conditions=conditions
            )
        ]

    def resume(self) -> list[iam.PolicyStatement]:
        """StartInstances only of instances tagged `stallwatch:resume`."""
        return [
            iam.PolicyStatement(
                sid="StartResumeOptedInInstances",
                actions=["ec2:StartInstances"],
                resources=[self._instances()],
                conditions={"Null": {f"aws:ResourceTag/{RESUME_TAG}": "false"}},
            )
        ]

    def state_rule(self) -> StateRule:
        return state_rule(
            "Ec2InstanceState",
            "aws.ec2",
            "EC2 Instance State-change Notification",
            "Stallwatch: EC2 instance state changes (the function keeps tagged GPU instances)",
        )

    def build(self, wiring: Wiring) -> None:
        if self.settings.log_subscription:
            wiring.subscriptions.subscribe("Ec2", wiring.nodes.log_group, self.config.ec2_log_group)
        self.recovery = RecoverInPlace(
            self.stack, "RecoverInPlace", deciding=[wiring.on_alarm, wiring.on_log_line], continuing=wiring.sweeper
        )

    def log_groups(self) -> list[str]:
        group = self.config.ec2_log_group
        return [group, f"{group.rstrip('/')}/*"]

    def watchdog_findings(self, arn: str) -> dict[str, str]:
        return {
            arn.format(service="ec2", resource="instance/*"): f"GPU instances are launched after deploy; "
            f"{stop_scope(self.config)}; ssm:SendCommand (Stallwatch's own documents) only to instances tagged "
            "stallwatch:recover=restart",
            **dict.fromkeys(
                (arn.format(service="logs", resource=f"log-group:{group}:*") for group in self.log_groups()),
                "read-only: the CloudWatch agent of EC2 training instances writes one stream per instance id, named "
                "at run time; a job may name a group under the configured one",
            ),
        }

    def _instances(self) -> str:
        return self.stack.format_arn(service="ec2", resource="instance", resource_name="*")


PART = Ec2Stack
