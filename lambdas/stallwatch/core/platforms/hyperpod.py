"""SageMaker HyperPod's own words about a Slurm node or job, read as what HyperPod does about it. Pure.

HyperPod watches its nodes itself: its health-monitoring agent writes a JSON line per detection to the node's stream
``SagemakerHealthMonitoringAgent/<group>/<instance-id>`` of the cluster's log group, and sends "SageMaker HyperPod
Cluster Node Health Event" on EventBridge; a node it reboots or replaces leaves Slurm with the reason
``Action:Reboot`` or ``Action:Replace``; and its auto-resume (``srun --auto-resume=1``) prints ``[Auto Resume] ...
ResumeAction=RETRYSTEP`` in the job's output when it replaces the job's nodes and retries the step. A node HyperPod
acts on, or a job its auto-resume restarts, is HyperPod's: Stallwatch records it, says so, and never acts on it too.
Its verdict separates the hardware (``XidHardwareFailure``: HyperPod reboots or replaces the node) from the
application (``XidUserAppError``: no node action; the job's own fault).

    found = agent_line(text, instance)      # HyperPodAction or None; both of the agent's JSON shapes
    found = node_reason("node7", "Action:Replace : Not responding [slurm@2024-02-21T01:53:15]", at)
    found = auto_resume(line_text, at)      # the job's auto-resume retrying its step on new nodes
    found = health_event(detail, at)        # EventBridge's node health event
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# What HyperPod does to a node, or to the job (auto-resume), and how long Stallwatch leaves the job to it.
REBOOT, REPLACE, RETRY_STEP, NONE = "Reboot", "Replace", "RetryStep", "None"
ACTING = frozenset({REBOOT, REPLACE, RETRY_STEP})
LEFT_TO_HYPERPOD_S = 3600.0  # a replacement and the job's restart fit in it; then Stallwatch watches the job again
HARDWARE, APPLICATION, UNKNOWN = "hardware", "application", "unknown"
# The agent's reasons with a verdict; its node conditions with the action HyperPod takes for them.
VERDICTS = {"XidHardwareFailure": HARDWARE, "XidUserAppError": APPLICATION}
CONDITION_ACTIONS = {"NvidiaErrorReboot": REBOOT, "NvidiaErrorTerminate": REPLACE}
AGENT_MARK = "HealthMonitoringAgentDetectionEvent"
AGENT_STREAM_PREFIX = "SagemakerHealthMonitoringAgent/"
NODE_REASON = re.compile(r"^Action:(?P<action>Reboot|Replace)\b")
AUTO_RESUME = re.compile(r"^\[Auto Resume\] \w+: JobID: (?P<job>\d+) .*\bResumeAction=(?P<action>[A-Z_]+)")
CONDITION = re.compile(r"\bNode condition (?P<condition>\w+) is now: True\b")
TEXT_CHARS = 200  # of HyperPod's own words kept with a finding (they go to Slack, escaped)
LINE_MAX = 16_384  # a longer line is none of the agent's


@dataclass(frozen=True)
class HyperPodAction:
    """What HyperPod said it does about one node (`node`: the Slurm node, or "" where only the instance is known), or
    about the job (`RETRY_STEP`), with its verdict and its own words."""

    action: str  # REBOOT, REPLACE, RETRY_STEP or NONE (seen, nothing done: the application's fault)
    verdict: str  # HARDWARE, APPLICATION or UNKNOWN
    source: str  # "health agent", "node reason", "auto-resume", "health event"
    at: float
    node: str = ""
    instance: str = ""
    said: str = ""

    @property
    def acting(self) -> bool:
        return self.action in ACTING

    def acting_at(self, now: float) -> bool:
        """HyperPod is acting on it at `now` (within `LEFT_TO_HYPERPOD_S` of what it said)."""
        return self.acting and now - self.at < LEFT_TO_HYPERPOD_S

    def note(self) -> str:
        """One line for the alert and the decision."""
        what = {
            REBOOT: "reboots",
            REPLACE: "replaces",
            RETRY_STEP: "retries the job's step on new nodes (auto-resume)",
            NONE: "takes no node action on",
        }[self.action]
        target = "" if self.action == RETRY_STEP else f" {self.node or self.instance}"
        verdict = {HARDWARE: "the hardware", APPLICATION: "the application", UNKNOWN: "no verdict"}[self.verdict]
        return f"HyperPod {what}{target} ({self.source}: {verdict}; {self.said})"

    def as_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def of_json(cls, data: dict[str, Any]) -> HyperPodAction:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


def agent_line(text: str, instance: str, at: float) -> HyperPodAction | None:
    """The health-monitoring agent's detection line, in either of its shapes (the docs' ``"details: "`` key, or
    ``"details"``), as what HyperPod does to the node on `instance`; None for any other line."""
    if AGENT_MARK not in text or len(text) > LINE_MAX:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    found = _plain_keys(found)
    details = found.get("details")
    if found.get(AGENT_MARK) != "HealthEvent" or not isinstance(details, dict):
        return None
    details = _plain_keys(details)
    reason, message = str(details.get("reason", "")), str(details.get("message", ""))
    verdict = VERDICTS.get(reason, UNKNOWN)
    condition = CONDITION.search(message)
    action = CONDITION_ACTIONS.get(condition["condition"], NONE) if condition else NONE
    if verdict == APPLICATION:
        action = NONE  # the application's fault: HyperPod leaves the node alone
    said = f"{reason}: {message}" if reason else message
    return HyperPodAction(action, verdict, "health agent", at, instance=instance, said=said[:TEXT_CHARS])


def _plain_keys(found: dict[str, Any]) -> dict[str, Any]:
    """The agent's keys without the ": " some of its lines end them with."""
    return {str(key).removesuffix(": ").strip(): value for key, value in found.items()}


def agent_stream_instance(stream: str) -> str | None:
    """The instance whose agent wrote `stream` (``SagemakerHealthMonitoringAgent/<group>/<instance-id>``)."""
    if not stream.startswith(AGENT_STREAM_PREFIX):
        return None
    instance = stream.rsplit("/", 1)[-1]
    return instance if re.fullmatch(r"i-[0-9a-f]{8,17}", instance) else None


def node_reason(node: str, reason: str, at: float) -> HyperPodAction | None:
    """A Slurm node's reason ``Action:Reboot`` or ``Action:Replace``, which HyperPod acts on; None for any other."""
    found = NODE_REASON.match(reason)
    if found is None:
        return None
    return HyperPodAction(found["action"], HARDWARE, "node reason", at, node=node, said=reason[:TEXT_CHARS])


def auto_resume(text: str, job_id: str, at: float) -> HyperPodAction | None:
    """Auto-resume's answer for job `job_id` in its output: ``ResumeAction=RETRYSTEP`` (HyperPod replaces the bad
    nodes and retries the step); None for any other line."""
    found = AUTO_RESUME.match(text)
    if found is None or found["job"] != job_id or found["action"] != "RETRYSTEP":
        return None
    return HyperPodAction(RETRY_STEP, HARDWARE, "auto-resume", at, said=text[:TEXT_CHARS])


def health_event(detail: dict[str, Any], at: float) -> HyperPodAction | None:
    """EventBridge's "SageMaker HyperPod Cluster Node Health Event" detail: an unhealthy node and what HyperPod does
    (``RepairAction`` Reboot or Replace; None: it only recommends); None for a healthy one."""
    summary = detail.get("HealthSummary") or {}
    if summary.get("HealthStatus") != "Unhealthy":
        return None
    repair = str(summary.get("RepairAction", ""))
    action = repair if repair in (REBOOT, REPLACE) else NONE
    reason = str(summary.get("HealthStatusReason", ""))
    said = "; ".join(filter(None, [reason, str(summary.get("Recommendation", ""))]))
    return HyperPodAction(
        action, HARDWARE, "health event", at, instance=str(detail.get("InstanceId", "")), said=said[:TEXT_CHARS]
    )
