"""SSM Run Command's answers, node by node: where each node's invocation of a command is, and what it failed.

Pure. `aws.ssm.invocations` reads them; recovery in place (`core.platforms.ec2_recovery`) and a platform's
asynchronous stops read its nodes' states from them.

    state = invocation_state("Failed", "Undeliverable")                        # NodeState.UNDELIVERABLE
    checks = command_states(invocations, ("i-1", "i-2"), deadline_passed=False)  # node -> NodeCheck
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class NodeState(StrEnum):
    """Where one node's invocation of a command is."""

    WAITING = "waiting"  # not delivered yet (Pending, Delayed)
    RUNNING = "running"  # delivered, not done (InProgress, Cancelling)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # ran and failed (a non-zero exit)
    TIMED_OUT = "timed_out"  # ran past its execution timeout, or past the control plane's wait
    UNDELIVERABLE = "undeliverable"  # never ran: the agent is down, the node is not managed, delivery timed out


NOT_DELIVERED_DETAILS = frozenset(
    {"Undeliverable", "Delivery Timed Out", "Terminated", "Invalid Platform", "InvalidPlatform", "Access Denied"}
)


def invocation_state(status: str, details: str) -> NodeState:
    """SSM's invocation Status (and StatusDetails, which tells delivery from execution) as a `NodeState`."""
    if status == "Success":
        return NodeState.SUCCEEDED
    if status in ("Pending", "Delayed"):
        return NodeState.WAITING
    if status in ("InProgress", "Cancelling"):
        return NodeState.RUNNING
    if details in NOT_DELIVERED_DETAILS or status == "Cancelled":
        return NodeState.UNDELIVERABLE
    if status == "TimedOut":
        return NodeState.TIMED_OUT
    return NodeState.FAILED


@dataclass(frozen=True)
class NodeCheck:
    """One node's answer to a command: its state and, for the health check, what it failed."""

    node: str
    state: NodeState
    failures: tuple[str, ...] = ()
    detail: str = ""  # SSM's words, for an invocation that did not succeed

    @property
    def healthy(self) -> bool:
        return self.state is NodeState.SUCCEEDED and not self.failures


@dataclass(frozen=True)
class Invocation:
    """One node's invocation as SSM reports it."""

    node: str
    status: str
    details: str
    output: str = ""
    code: int | None = None  # the script's exit code


def command_states(
    invocations: Mapping[str, Invocation], nodes: tuple[str, ...], deadline_passed: bool
) -> dict[str, NodeCheck]:
    """Each node's answer to a command: one still running past the wait timed out (the node's failure), one never
    delivered by then is undeliverable. A node without an invocation yet is waited for (Run Command's reads are
    eventually consistent: a command just sent may list none), then undeliverable too."""
    checks: dict[str, NodeCheck] = {}
    for node in nodes:
        invocation = invocations.get(node)
        if invocation is None:
            missing = NodeState.UNDELIVERABLE if deadline_passed else NodeState.WAITING
            checks[node] = NodeCheck(node, missing, detail="no invocation for the node")
            continue
        state = invocation_state(invocation.status, invocation.details)
        detail = f"{invocation.status}: {invocation.details}"
        if deadline_passed and state is NodeState.RUNNING:
            state = NodeState.TIMED_OUT
        elif deadline_passed and state is NodeState.WAITING:
            state, detail = NodeState.UNDELIVERABLE, f"{detail}, not delivered in time"
        failures = {
            NodeState.TIMED_OUT: ("timed out",),
            NodeState.FAILED: (f"exited {invocation.code}",),
        }.get(state, ())
        checks[node] = NodeCheck(node, state, failures, "" if state is NodeState.SUCCEEDED else detail)
    return checks
