"""Slurm's part of the stack: reading the nodes' instances and the jobs' log group, and the Slurm resources
(`slurm_actions.SlurmActions`): the bus of deploy/slurm's job events and its rule, HyperPod's node health rule, the
controllers' policy (their events, their runner's commands in the table), the HyperPod grants of the functions that
act, and the group's fatal-line subscription. The training nodes write only streams named by their instance (the
EC2 nodes' grant covers the Slurm group, under the EC2 one).
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam

from stacks.ec2_training import log_group_arns
from stacks.platforms.base import PlatformStack, Wiring, in_this_region
from stacks.platforms.slurm_actions import HYPERPOD_LOG_GROUPS, SlurmActions


class SlurmStack(PlatformStack):
    """Slurm jobs; `actions`: the bus, the log group and the controller's policy, once built."""

    name = "slurm"
    instance_hosts = True  # ParallelCluster and PCS nodes; HyperPod's are none

    @property
    def log_group(self) -> str:
        """The Slurm jobs' group, under the EC2 group (`StallwatchConfig.log_group`)."""
        group = self.config.log_group(self.name)
        assert group is not None
        return group

    def read_jobs(self) -> list[iam.PolicyStatement]:
        # DescribeInstances has no resource-level permissions (the nodes' instances, by address in their VPC).
        return [in_this_region("DescribeInstances", ["ec2:DescribeInstances"])]

    def read_logs(self) -> list[iam.PolicyStatement]:
        # One stream per job and node, named by its instance.
        read = ["logs:DescribeLogStreams", "logs:FilterLogEvents"]
        groups = log_group_arns(self.stack, self.log_group)[:1]
        return [iam.PolicyStatement(sid="ReadSlurmJobLogs", actions=read, resources=groups)]

    def build(self, wiring: Wiring) -> None:
        # The rule of the job events is on the Slurm bus (`SlurmActions`), not the default one: no `state_rule`.
        acting = [wiring.on_alarm, wiring.sweeper, wiring.on_job_state]
        if self.settings.log_subscription:  # their group's fatal lines wake on_log_line, which decides them then
            acting.append(wiring.on_log_line)
        self.actions = SlurmActions(
            self.stack,
            "SlurmActions",
            deployment=wiring.deployment,
            on_job_state=wiring.on_job_state,
            acting=acting,
            table=wiring.table,
            log_group=self.log_group,
            dead_letter_queue=wiring.dead_letter_queue,
        )
        if self.settings.log_subscription:
            wiring.subscriptions.subscribe("Slurm", self.actions.log_group, self.log_group)

    def log_groups(self) -> list[str]:
        return [self.log_group]

    def outputs(self) -> dict[str, tuple[str, str]]:
        return {
            "SlurmControllerPolicyArn": (
                self.actions.controller_policy.managed_policy_arn,
                "Managed policy for a Slurm controller's role (deploy/slurm): its job events, its runner's commands",
            ),
            "SlurmEventBusName": (
                self.actions.bus.event_bus_name,
                "Event bus of the Slurm job events: deploy/slurm's STALLWATCH_EVENT_BUS on the controllers",
            ),
            "SlurmLogGroup": (
                self.actions.log_group.log_group_name,
                "Log group of Slurm jobs' output: deploy/slurm/cloudwatch-agent.json's log_group_name on the nodes",
            ),
        }

    def watchdog_findings(self, arn: str) -> dict[str, str]:
        return {
            arn.format(service="logs", resource=f"log-group:{self.log_group}:*"): "read-only: the CloudWatch agent of "
            "Slurm nodes writes one stream per job and node (named by its instance), at run time",
            arn.format(service="sagemaker", resource="cluster/*"): "HyperPod clusters are created after deploy, and a "
            "Slurm job names its own (its controller's target): ListClusterNodes finds its nodes, "
            "BatchReplaceClusterNodes replaces the ones Stallwatch drained (docs/deploy.md, Slurm)",
            arn.format(service="logs", resource=f"log-group:{HYPERPOD_LOG_GROUPS}"): "read-only: each HyperPod "
            "cluster's group (named by the cluster, created with it) holds its health agent's lines",
        }


PART = SlurmStack
