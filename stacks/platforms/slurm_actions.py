"""The Slurm platform's infrastructure: its event bus and rules, its log group, the controllers' policy, and what
the functions need to act on its jobs.

- The bus (`bus`): deploy/slurm's job events come on a bus of their own, whose resource policy admits PutEvents only
  from a role tagged `stallwatch:slurm=controller` (the controllers' and login nodes' role), with source
  `stallwatch.slurm`; the rule `SlurmJobState` listens there. No one else's "started" or "ended" reaches on_job_state.
- HyperPod's node health events (`aws.sagemaker`, "SageMaker HyperPod Cluster Node Health Event") on the default bus
  reach on_job_state too: what HyperPod does about a node is kept with its jobs.
- The controllers' policy (`controller_policy`): PutEvents on the bus, and the runner's reads and answers of its
  commands in the table (deploy/slurm/stallwatch-runner: Query, UpdateItem only of the `slurm-command#*` and
  `slurm-runner` partitions). There is no SSM document and no inbound path: the runner pulls.
- The functions that decide or stop (`acting`): SageMaker's cluster-node APIs of HyperPod clusters (ListClusterNodes
  to find a job's nodes, BatchReplaceClusterNodes of the nodes Stallwatch drained, at most 25 a call), and the
  health agent's lines in the clusters' log groups.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_dynamodb import ITable
from constructs import Construct

from stacks.constants import EC2_LOG_RETENTION, EVENT_RETRY_ATTEMPTS
from stallwatch.core.contract import SLURM_EVENT_DETAIL_TYPE, SLURM_EVENT_SOURCE
from stallwatch.core.policy import SLURM_CONTROLLER_TAG, SLURM_CONTROLLER_VALUE

EVENT_SOURCE = SLURM_EVENT_SOURCE  # deploy/slurm/stallwatch-events.sh's events
HYPERPOD_NODE_HEALTH = "SageMaker HyperPod Cluster Node Health Event"
HYPERPOD_LOG_GROUPS = "/aws/sagemaker/Clusters/*"  # /aws/sagemaker/Clusters/<cluster name>/<cluster id>
# The runner's partitions of the table (lambdas/stallwatch/aws/platforms/slurm_runner.py).
RUNNER_KEYS = ["slurm-command#*", "slurm-runner"]
CONTROLLER_PRINCIPAL_TAG = f"aws:PrincipalTag/{SLURM_CONTROLLER_TAG}"
EVENT_MAX_AGE = Duration.hours(2)


class SlurmActions(Construct):
    """The bus (`bus`) and its rule to `on_job_state`, HyperPod's health rule, the log group (`log_group`), the
    controllers' managed policy (`controller_policy`), and the HyperPod grants of the `acting` functions."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        deployment: str,
        on_job_state: lambda_.IFunction,
        acting: list[lambda_.Function],
        table: ITable,
        log_group: str,
        dead_letter_queue: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        # The agent on the nodes writes the jobs' logs here (deploy/slurm/cloudwatch-agent.json), never creating it.
        self.log_group = logs.LogGroup(
            self, "LogGroup", log_group_name=log_group, retention=EC2_LOG_RETENTION, removal_policy=RemovalPolicy.RETAIN
        )
        self.bus = self._build_bus(deployment)
        target = targets.LambdaFunction(
            on_job_state,
            dead_letter_queue=dead_letter_queue,
            retry_attempts=EVENT_RETRY_ATTEMPTS,
            max_event_age=EVENT_MAX_AGE,
        )
        self.job_rule = events.Rule(
            self,
            "SlurmJobState",
            event_bus=self.bus,
            description="Stallwatch: Slurm job starts and ends (deploy/slurm's prolog and epilog) from the controllers",
            event_pattern=events.EventPattern(source=[EVENT_SOURCE], detail_type=[SLURM_EVENT_DETAIL_TYPE]),
            targets=[target],
        )
        self.health_rule = events.Rule(
            self,
            "HyperPodNodeHealth",
            description="Stallwatch: what SageMaker HyperPod does about a node (kept with the Slurm jobs on it)",
            event_pattern=events.EventPattern(source=["aws.sagemaker"], detail_type=[HYPERPOD_NODE_HEALTH]),
            targets=[target],
        )
        for function in acting:
            for statement in self._hyperpod_statements():
                function.add_to_role_policy(statement)
        self.controller_policy = self._build_controller_policy(table)

    def _build_bus(self, deployment: str) -> events.EventBus:
        """The bus of the controllers' job events: PutEvents only by a principal whose role is tagged
        `stallwatch:slurm=controller` (an explicit Deny for any other, which no identity policy overrides)."""
        bus = events.EventBus(self, "Bus", event_bus_name=f"{deployment}-slurm")
        account = iam.AccountRootPrincipal()
        bus.add_to_resource_policy(
            iam.PolicyStatement(
                sid="ControllersPutSlurmJobEvents",
                effect=iam.Effect.ALLOW,
                principals=[account],
                actions=["events:PutEvents"],
                resources=[bus.event_bus_arn],
                conditions={
                    "StringEqualsIgnoreCase": {CONTROLLER_PRINCIPAL_TAG: SLURM_CONTROLLER_VALUE},
                    "StringEquals": {"events:source": EVENT_SOURCE},
                },
            )
        )
        bus.add_to_resource_policy(
            iam.PolicyStatement(
                sid="NoOneElsePutsSlurmJobEvents",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["events:PutEvents"],
                resources=[bus.event_bus_arn],
                conditions={"StringNotEqualsIgnoreCase": {CONTROLLER_PRINCIPAL_TAG: SLURM_CONTROLLER_VALUE}},
            )
        )
        return bus

    def _hyperpod_statements(self) -> list[iam.PolicyStatement]:
        stack = Stack.of(self)
        clusters = stack.format_arn(service="sagemaker", resource="cluster", resource_name="*")
        groups = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=HYPERPOD_LOG_GROUPS,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        return [
            iam.PolicyStatement(
                sid="HyperPodClusterNodes",
                actions=[
                    "sagemaker:ListClusterNodes",
                    "sagemaker:BatchReplaceClusterNodes",
                ],
                resources=[clusters],
            ),
            iam.PolicyStatement(
                sid="ReadHyperPodHealthAgent",
                actions=["logs:DescribeLogGroups", "logs:FilterLogEvents"],
                resources=[groups],
            ),
        ]

    def _build_controller_policy(self, table: ITable) -> iam.ManagedPolicy:
        return iam.ManagedPolicy(
            self,
            "ControllerPolicy",
            description="A Slurm controller or login node: deploy/slurm's job events and its runner's commands",
            statements=[
                iam.PolicyStatement(
                    sid="PutSlurmJobEvents",
                    actions=["events:PutEvents"],
                    resources=[self.bus.event_bus_arn],
                    conditions={"StringEquals": {"events:source": EVENT_SOURCE}},
                ),
                iam.PolicyStatement(
                    sid="RunnerCommands",
                    actions=["dynamodb:Query", "dynamodb:UpdateItem"],
                    resources=[table.table_arn],
                    conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": RUNNER_KEYS}},
                ),
            ],
        )
