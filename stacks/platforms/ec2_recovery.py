"""Recover in place: Stallwatch's two SSM documents, and what the deciding functions may do with them.

- `health_check`: deploy/ssm/health-check.yaml, one JSON line of a node's GPU, NVLink, EFA and DCGM health;
- `restart`: deploy/ssm/restart-training.yaml, `systemctl restart stallwatch-train.service` (deploy/ec2's unit).

`on_alarm` and `on_log_line` may send the health check (a stop decision starts the recovery); the sweeper, which
continues it, may send both, read the invocations and mark a bad node unhealthy in its Auto Scaling group.
SendCommand is granted only with these two documents and only on instances tagged `stallwatch:recover=restart`;
SetInstanceHealth only on groups tagged so (the tag propagates to their instances). The functions get the documents'
names in their environment.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, ArnFormat, Aws, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.documents import DOCUMENTS_DIR, command_document
from stacks.nag import arn_template
from stallwatch.core.config import HEALTH_CHECK_DOCUMENT_ENV, RESTART_DOCUMENT_ENV
from stallwatch.core.policy import RECOVER_RESTART, RECOVER_TAG

HEALTH_CHECK_FILE = DOCUMENTS_DIR / "health-check.yaml"
RESTART_FILE = DOCUMENTS_DIR / "restart-training.yaml"
# IgnoreCase: the code reads the tag value case-insensitively too. Auto Scaling's own key for a group's tags.
RECOVER_OPT_IN_CONDITION = {"StringEqualsIgnoreCase": {f"aws:ResourceTag/{RECOVER_TAG}": RECOVER_RESTART}}
GROUP_OPT_IN_CONDITION = {"StringEqualsIgnoreCase": {f"autoscaling:ResourceTag/{RECOVER_TAG}": RECOVER_RESTART}}
AUTO_SCALING_GROUPS = "autoScalingGroup:*:autoScalingGroupName/*"


class RecoverInPlace(Construct):
    """The documents (`health_check`, `restart`), granted to `deciding` (on_alarm, on_log_line: the health check) and
    `continuing` (the sweeper: both, the invocations, SetInstanceHealth)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, deciding: list[lambda_.Function], continuing: lambda_.Function
    ) -> None:
        super().__init__(scope, construct_id)
        self.health_check = command_document(self, "HealthCheck", HEALTH_CHECK_FILE)
        self.restart = command_document(self, "RestartTraining", RESTART_FILE)
        names = {HEALTH_CHECK_DOCUMENT_ENV: self.health_check.ref, RESTART_DOCUMENT_ENV: self.restart.ref}
        for function in (*deciding, continuing):
            for name, value in names.items():
                function.add_environment(name, value)
        for function in deciding:
            for statement in self._send([self.health_check]):
                function.add_to_role_policy(statement)
        for statement in [*self._send([self.health_check, self.restart]), *self._continue()]:
            continuing.add_to_role_policy(statement)
        groups = arn_template(Stack.of(self)).format(service="autoscaling", resource=AUTO_SCALING_GROUPS)
        assert continuing.role is not None
        Validations.of(continuing.role).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{groups}]",
                reason="a training cluster's Auto Scaling group is created after deploy; SetInstanceHealth only on "
                f"groups tagged {RECOVER_TAG}={RECOVER_RESTART} (aws:ResourceTag condition)",
            )
        )

    def _document_arn(self, document: ssm.CfnDocument) -> str:
        return Stack.of(self).format_arn(service="ssm", resource="document", resource_name=document.ref)

    def _send(self, documents: list[ssm.CfnDocument]) -> list[iam.PolicyStatement]:
        """SendCommand of Stallwatch's own documents, only to instances opted in (IAM authorizes a SendCommand
        against the document and each instance: one statement for each, the condition on the instances')."""
        instances = Stack.of(self).format_arn(service="ec2", resource="instance", resource_name="*")
        return [
            iam.PolicyStatement(
                sid="SendStallwatchDocuments",
                actions=["ssm:SendCommand"],
                resources=[self._document_arn(d) for d in documents],
            ),
            iam.PolicyStatement(
                sid="SendCommandToRecoverOptedInInstances",
                actions=["ssm:SendCommand"],
                resources=[instances],
                conditions=RECOVER_OPT_IN_CONDITION,
            ),
        ]

    def _continue(self) -> list[iam.PolicyStatement]:
        groups = Stack.of(self).format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name="*:autoScalingGroupName/*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        return [
            # ListCommands and ListCommandInvocations have no resource-level permissions.
            iam.PolicyStatement(
                sid="ReadCommandInvocations",
                actions=["ssm:ListCommands", "ssm:ListCommandInvocations"],
                resources=["*"],
                conditions={"StringEquals": {"aws:RequestedRegion": Aws.REGION}},
            ),
            iam.PolicyStatement(
                sid="MarkRecoverOptedInNodesUnhealthy",
                actions=["autoscaling:SetInstanceHealth"],
                resources=[groups],
                conditions=GROUP_OPT_IN_CONDITION,
            ),
        ]
