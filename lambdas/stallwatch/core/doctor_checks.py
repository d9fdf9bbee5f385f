"""`stallwatch doctor`'s lines, as the doctor (`offline.doctor`) and each platform's adapter (`doctor`) make them.

found = StackFound("stallwatch", functions, rules, region="us-east-1", account="123456789012")
rule_check(found, "Slurm job events rule", "stallwatch.slurm")   # Check(name, Status.OK, "stallwatch-...")
Probe("on_alarm", "ec2:StopInstances", arn, tags={}, allowed=False)  # an IAM question the doctor simulates
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE

# The functions by what they do (the doctor finds them by handler): those that stop a job, those that resume one.
STOPPING_ROLES = ("on_alarm", "sweeper", "slack_interactions")
RESUMING_ROLES = ("on_job_state", "sweeper")
PROBE_JOB = "stallwatch-doctor-probe"  # the job (and role) the IAM probes name
PROBE_INSTANCE = "i-00000000000000000"


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: what was checked, how it went, and the fix for a warning or failure."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Probe:
    """One IAM question: may `role` do `action` on `resource` with `tags` (context keys), and should it."""

    role: str
    action: str
    resource: str
    tags: dict[str, str]
    allowed: bool


@dataclass(frozen=True)
class StackFound:
    """What the doctor found of the deployed stack: its functions' configurations by role (on_alarm, ...), its
    EventBridge rules (DescribeRule's answers), where it is."""

    stack: str
    functions: dict[str, dict[str, Any]]
    rules: list[dict[str, Any]] = field(default_factory=list)
    region: str = ""
    account: str = ""

    @property
    def redeploy(self) -> str:
        return f"deploy the stack again: npx cdk deploy {self.stack}"

    def env(self, variable: str) -> str | None:
        """A variable of the functions' environment (the first function's that has one)."""
        return next((v for f in self.functions.values() if (v := f["Environment"]["Variables"].get(variable))), None)


def stop_probes(action: str, resource: str, stop_requires_tag: bool) -> list[Probe]:
    """The stopping functions may do `action` on `resource` tagged `stallwatch:mode=enforce`, and without the tag only
    where the policy allows stopping any job (`stop_requires_tag` false)."""
    tagged = {f"aws:ResourceTag/{STOP_OPT_IN_TAG}": STOP_OPT_IN_VALUE}
    return [
        probe
        for role in STOPPING_ROLES
        for probe in (
            Probe(role, action, resource, tagged, True),
            Probe(role, action, resource, {}, not stop_requires_tag),
        )
    ]


def rule_check(found: StackFound, name: str, source: str) -> Check:
    """The stack's rule of the events of `source` exists and is enabled."""
    rule = next((r for r in found.rules if source in r.get("EventPattern", "")), None)
    if rule is None:
        return Check(name, Status.FAIL, "not in the stack", found.redeploy)
    if rule.get("State") != "ENABLED":
        return Check(
            name, Status.FAIL, f"{rule['Name']} is {rule.get('State')}", f"aws events enable-rule --name {rule['Name']}"
        )
    return Check(name, Status.OK, rule["Name"])
