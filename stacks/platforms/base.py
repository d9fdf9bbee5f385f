"""One platform's part of the Stallwatch stack (`PlatformStack`): what the functions may do on it, the rule of its
state-change events, its log group's fatal-line subscription and its own resources. The stack wires the watched
platforms' parts (`stacks.platforms.watched`) and never branches on a platform.

Built in two steps: the grants and the rule before the functions (their roles are made with them, `Watchdog`), the
resources after (`build`, with the functions and the shared constructs in `Wiring`). A resource keeps the construct
path it had before the platforms had parts of their own (its logical id, so an update never replaces it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from aws_cdk import Aws, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_dynamodb import ITable

from stacks.ec2_training import Ec2Training
from stacks.log_subscriptions import FatalLineSubscriptions
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE


@dataclass(frozen=True)
class StateRule:
    """The EventBridge rule of a platform's state-change events to on_job_state (its construct id in the watchdog)."""

    construct_id: str
    pattern: events.EventPattern
    description: str


@dataclass(frozen=True)
class Wiring:
    """What a platform's resources are wired to, once the stack has made it: the functions, the asset they share,
    the fatal-line subscriptions, the training nodes' construct (their log group and instance policy), the table and
    the events' dead-letter queue."""

    deployment: str
    on_alarm: lambda_.Function
    sweeper: lambda_.Function
    on_job_state: lambda_.Function
    on_log_line: lambda_.Function
    slack_endpoint: lambda_.Function
    code: lambda_.Code
    subscriptions: FatalLineSubscriptions
    nodes: Ec2Training
    table: ITable
    dead_letter_queue: sqs.IQueue

    @property
    def deciders(self) -> list[lambda_.Function]:
        """The functions that decide on a job and may act on the decision."""
        return [self.on_alarm, self.sweeper, self.on_log_line]


class PlatformStack:
    """A watched platform's part of the stack; each method answers for this platform only (nothing by default)."""

    name: ClassVar[str]  # its key under `platforms:` in the config, and its module's name
    # Its hosts are EC2 instances of the account: AWS Health's events for an instance reach its jobs (`health_events`).
    instance_hosts: ClassVar[bool] = False

    def __init__(self, stack: Stack, config: StallwatchConfig) -> None:
        self.stack = stack
        self.config = config
        self.settings = config.platforms.of(self.name)

    # ---- grants, by what a function does (stacks/permissions.py) ---------------------------------------------------

    def read_jobs(self) -> list[iam.PolicyStatement]:
        """Read a job's facts and tags."""
        return []

    def read_logs(self) -> list[iam.PolicyStatement]:
        """Read its jobs' training logs."""
        return []

    def stop(self, conditions: dict[str, Any] | None) -> list[iam.PolicyStatement]:
        """Stop a job, under `conditions` (the stop opt-in tag's, unless the policy allows any)."""
        return []

    def resume(self) -> list[iam.PolicyStatement]:
        """Start the next attempt of a run Stallwatch stopped, only where it opted in."""
        return []

    def sweep(self) -> list[iam.PolicyStatement]:
        """What the sweeper needs beyond a decider's: its listing of the running jobs."""
        return []

    def state_rule(self) -> StateRule | None:
        """The rule of its state-change events; None where it has none."""
        return None

    # ---- its own resources, after the functions ---------------------------------------------------------------

    def build(self, wiring: Wiring) -> None:
        """Its resources (documents, log groups, subscriptions), wired to the functions."""

    def log_groups(self) -> list[str]:
        """The log groups its functions read (with the groups under them, where a job may name one)."""
        return []

    def outputs(self) -> dict[str, tuple[str, str]]:
        """The stack outputs it adds: id -> (value, what to do with it)."""
        return {}

    def watchdog_findings(self, arn: str) -> dict[str, str]:
        """The wildcards its grants to the functions keep (cdk-nag's IAM5), and why: resource -> reason."""
        return {}

    def nodes_findings(self, arn: str) -> dict[str, str]:
        """The wildcards its grants to the training nodes keep, and why."""
        return {}


def in_this_region(sid: str, actions: list[str]) -> iam.PolicyStatement:
    """For APIs without resource-level permissions: any resource, in this region only."""
    return iam.PolicyStatement(
        sid=sid, actions=actions, resources=["*"], conditions={"StringEquals": {"aws:RequestedRegion": Aws.REGION}}
    )


def stop_scope(config: StallwatchConfig) -> str:
    """What limits the stops, in a cdk-nag acknowledgment's words."""
    if config.policy.stop_requires_tag:
        return f"only resources tagged {STOP_OPT_IN_TAG}={STOP_OPT_IN_VALUE} can be stopped (aws:ResourceTag condition)"
    return "policy.stop_requires_tag is false: the operator allowed stopping any job or instance"


def state_rule(construct_id: str, source: str, detail_type: str, description: str) -> StateRule:
    return StateRule(construct_id, events.EventPattern(source=[source], detail_type=[detail_type]), description)
