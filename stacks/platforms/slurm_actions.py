"""The Slurm platform's actions: Stallwatch's two SSM documents, who may send them where, and the controller's policy.

- `cancel`: deploy/ssm/slurm-cancel.yaml, `scancel` of the running job it names (its submit time must match);
- `requeue`: deploy/ssm/slurm-requeue.yaml, the job's bad nodes drained with Stallwatch's reason (FAIL with
  `Action:Replace` or `Action:Reboot` on HyperPod), then `scontrol requeue`.

Both run on the cluster's controller or a login node. The functions that stop (on_alarm, the sweeper, the Slack
endpoint's "Stop now") may send the cancel; those that decide (on_alarm, the sweeper) the requeue too. SendCommand is
granted with these documents only, and only to instances tagged `stallwatch:slurm=controller`; an instance is never
stopped. `controller_policy` is what the controller's role needs to post deploy/slurm's job events (PutEvents of
source `stallwatch.slurm` on the default bus only).
"""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.constants import EC2_LOG_RETENTION
from stacks.documents import DOCUMENTS_DIR, command_document
from stallwatch.core.config import SLURM_CANCEL_DOCUMENT_ENV, SLURM_REQUEUE_DOCUMENT_ENV
from stallwatch.core.contract import SLURM_EVENT_SOURCE
from stallwatch.core.policy import SLURM_CONTROLLER_TAG, SLURM_CONTROLLER_VALUE

CANCEL_FILE = DOCUMENTS_DIR / "slurm-cancel.yaml"
REQUEUE_FILE = DOCUMENTS_DIR / "slurm-requeue.yaml"
EVENT_SOURCE = SLURM_EVENT_SOURCE  # deploy/slurm/stallwatch-events.sh's events
EVENT_BUS = "default"
# IgnoreCase: an operator's tag value in any case.
CONTROLLER_CONDITION = {"StringEqualsIgnoreCase": {f"aws:ResourceTag/{SLURM_CONTROLLER_TAG}": SLURM_CONTROLLER_VALUE}}


class SlurmActions(Construct):
    """The documents (`cancel`, `requeue`), granted to `stopping` (cancel) and `recovering` (both), and the
    controller's managed policy (`controller_policy`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        stopping: list[lambda_.Function],
        recovering: list[lambda_.Function],
        reading: list[lambda_.Function],
        log_group: str,
    ) -> None:
        super().__init__(scope, construct_id)
        # The agent on the nodes writes the jobs' logs here (deploy/slurm/cloudwatch-agent.json), never creating it.
        self.log_group = logs.LogGroup(
            self, "LogGroup", log_group_name=log_group, retention=EC2_LOG_RETENTION, removal_policy=RemovalPolicy.RETAIN
        )
        self.cancel = command_document(self, "Cancel", CANCEL_FILE)
        self.requeue = command_document(self, "Requeue", REQUEUE_FILE)
        names = {SLURM_CANCEL_DOCUMENT_ENV: self.cancel.ref, SLURM_REQUEUE_DOCUMENT_ENV: self.requeue.ref}
        for function in dict.fromkeys([*stopping, *recovering]):
            for name, value in names.items():
                function.add_environment(name, value)
            documents = [self.cancel, self.requeue] if function in recovering else [self.cancel]
            for statement in self._send(documents):
                function.add_to_role_policy(statement)
        for function in reading:  # the sweeper reads each command's answer (runtime.settle)
            function.add_to_role_policy(
                iam.PolicyStatement(
                    sid="ReadSlurmCommandAnswers",
                    actions=["ssm:ListCommandInvocations"],
                    resources=["*"],  # no resource-level permissions
                    conditions={"StringEquals": {"aws:RequestedRegion": Aws.REGION}},
                )
            )
        self.controller_policy = self._build_controller_policy()

    def _send(self, documents: list[ssm.CfnDocument]) -> list[iam.PolicyStatement]:
        """SendCommand of the Slurm documents only, to controllers only (IAM authorizes it against the document and
        each instance: one statement for each, the tag condition on the instances')."""
        stack = Stack.of(self)
        instances = stack.format_arn(service="ec2", resource="instance", resource_name="*")
        return [
            iam.PolicyStatement(
                sid="SendStallwatchSlurmDocuments",
                actions=["ssm:SendCommand"],
                resources=[
                    stack.format_arn(service="ssm", resource="document", resource_name=d.ref) for d in documents
                ],
            ),
            iam.PolicyStatement(
                sid="SendCommandToSlurmControllers",
                actions=["ssm:SendCommand"],
                resources=[instances],
                conditions=CONTROLLER_CONDITION,
            ),
        ]

    def _build_controller_policy(self) -> iam.ManagedPolicy:
        bus = Stack.of(self).format_arn(service="events", resource="event-bus", resource_name=EVENT_BUS)
        return iam.ManagedPolicy(
            self,
            "ControllerPolicy",
            description="A Slurm controller posting deploy/slurm's job events to Stallwatch",
            statements=[
                iam.PolicyStatement(
                    sid="PutSlurmJobEvents",
                    actions=["events:PutEvents"],
                    resources=[bus],
                    conditions={"StringEquals": {"events:source": EVENT_SOURCE}},
                )
            ],
        )
