"""Slurm's part of the stack: the rule of deploy/slurm's job events, reading the nodes' instances and the jobs' log
group, Stallwatch's Slurm documents and who may send them (`slurm_actions.SlurmActions`), the group's fatal-line
subscription, and the training nodes' grant to write one stream per job and node.
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam

from stacks.constants import SLURM_NODE_STREAMS
from stacks.ec2_training import log_group_arns, log_stream_arn
from stacks.platforms.base import PlatformStack, StateRule, Wiring, in_this_region, state_rule
from stacks.platforms.slurm_actions import SlurmActions
from stallwatch.core.contract import SLURM_EVENT_DETAIL_TYPE, SLURM_EVENT_SOURCE


class SlurmStack(PlatformStack):
    """Slurm jobs; `actions`: the documents, the log group and the controller's policy, once built."""

    name = "slurm"
    instance_hosts = True  # ParallelCluster and PCS nodes; HyperPod's are none

    @property
    def log_group(self) -> str:
        """The Slurm jobs' group, under the EC2 group (`StallwatchConfig.log_group`)."""
        group = self.config.log_group(self.name)
        assert group is not None
        return group

    def read_jobs(self) -> list[iam.PolicyStatement]:
        # DescribeInstances has no resource-level permissions (the nodes' instances, by address).
        return [in_this_region("DescribeInstances", ["ec2:DescribeInstances"])]

    def read_logs(self) -> list[iam.PolicyStatement]:
        # One stream per job and node, read by the job's prefix.
        read = ["logs:DescribeLogStreams", "logs:FilterLogEvents"]
        groups = log_group_arns(self.stack, self.log_group)[:1]
        return [iam.PolicyStatement(sid="ReadSlurmJobLogs", actions=read, resources=groups)]

    def state_rule(self) -> StateRule:
        return state_rule(
            "SlurmJobState",
            SLURM_EVENT_SOURCE,
            SLURM_EVENT_DETAIL_TYPE,
            "Stallwatch: Slurm job starts and ends (deploy/slurm's prolog and epilog)",
        )

    def build(self, wiring: Wiring) -> None:
        deciders = [wiring.on_alarm, wiring.sweeper]
        if self.settings.log_subscription:  # their group's fatal lines wake on_log_line, which decides them then
            deciders.append(wiring.on_log_line)
        self.actions = SlurmActions(
            self.stack,
            "SlurmActions",
            stopping=[*deciders, wiring.slack_endpoint],
            recovering=deciders,
            reading=[wiring.sweeper],
            log_group=self.log_group,
        )
        if self.settings.log_subscription:
            wiring.subscriptions.subscribe("Slurm", self.actions.log_group, self.log_group)
        # SLURM (the Slurm helper): its nodes name one stream per job and node (deploy/slurm), not by instance id
        # yet; once they do, this statement goes and the nodes' instance-id grant covers them.
        wiring.nodes.policy.add_statements(
            iam.PolicyStatement(
                sid="ShipSlurmJobLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_stream_arn(self.stack, self.log_group, SLURM_NODE_STREAMS)],
            )
        )

    def log_groups(self) -> list[str]:
        return [self.log_group]

    def outputs(self) -> dict[str, tuple[str, str]]:
        return {
            "SlurmControllerPolicyArn": (
                self.actions.controller_policy.managed_policy_arn,
                "Managed policy to attach to a Slurm controller's role (deploy/slurm): post its job events",
            ),
            "SlurmLogGroup": (
                self.actions.log_group.log_group_name,
                "Log group of Slurm jobs' output: deploy/slurm/cloudwatch-agent.json's log_group_name on the nodes",
            ),
        }

    def watchdog_findings(self, arn: str) -> dict[str, str]:
        return {
            arn.format(service="ec2", resource="instance/*"): "ssm:SendCommand of the Slurm documents only to "
            "instances tagged stallwatch:slurm=controller",
            arn.format(service="logs", resource=f"log-group:{self.log_group}:*"): "read-only: the CloudWatch agent of "
            "Slurm nodes writes one stream per job and node, named at run time",
        }

    def nodes_findings(self, arn: str) -> dict[str, str]:
        streams = f"log-group:{self.log_group}:log-stream:{SLURM_NODE_STREAMS}"
        return {
            arn.format(service="logs", resource=streams): "each Slurm node's agent creates and writes one stream per "
            "job and node, named at run time"
        }


PART = SlurmStack
