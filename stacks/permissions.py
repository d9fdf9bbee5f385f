"""Least-privilege IAM statements for the functions, one builder per need: the watched platforms' grants
(`stacks.platforms`), and the grants every deployment needs.

No statement has a `*` action. Stops are conditioned on the opt-in tag (`stallwatch:mode=enforce`) unless
`policy.stop_requires_tag` is False; resumes on the resume tags (each platform's `resume`); alarm writes are scoped to
the alarm-name prefix. The few APIs without resource-level permissions get resource `*` with a condition where IAM
offers one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from operator import methodcaller

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam

from stacks.platforms.base import PlatformStack, in_this_region
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.contract import NAMESPACE
from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE

# IgnoreCase: the engine reads the tag value case-insensitively too.
STOP_OPT_IN_CONDITION = {"StringEqualsIgnoreCase": {f"aws:ResourceTag/{STOP_OPT_IN_TAG}": STOP_OPT_IN_VALUE}}


class WatchdogPermissions:
    """The statements each function needs in `stack`, given the deployment's config and its watched platforms."""

    def __init__(self, stack: Stack, config: StallwatchConfig, platforms: list[PlatformStack]) -> None:
        self.stack = stack
        self.config = config
        self.policy = config.policy
        self.platforms = platforms

    def on_job_state(self) -> list[iam.PolicyStatement]:
        """Start and end of a job: read it, create or delete its alarms, resume it after Stallwatch's stop, and
        read its run's metrics for the end-of-run goodput summary."""
        return [*self._read_jobs(), *self._manage_alarms(), *self._resume(), self._read_metrics()]

    def on_alarm(self) -> list[iam.PolicyStatement]:
        """An alarm fired: gather signals, decide, maybe stop."""
        return [*self._read_jobs(), self._describe_alarms(), self._read_metrics(), *self._read_logs(), *self._stop()]

    def on_log_line(self) -> list[iam.PolicyStatement]:
        """A fatal line in a training log: find its job (an EC2 instance's tags), gather signals, decide, maybe stop."""
        return [*self._read_jobs(), self._read_metrics(), *self._read_logs(), *self._stop()]

    def sweeper(self) -> list[iam.PolicyStatement]:
        """The periodic pass: find jobs, reconcile their alarms, publish log idleness, decide like `on_alarm`, and
        try again the resumes that failed for a reason a later try can fix (the same grants as `on_job_state`'s)."""
        return [
            *self._read_jobs(),
            *self._manage_alarms(),
            self._read_metrics(),
            *self._read_logs(),
            *self._stop(),
            *self._resume(),
            *self._each(methodcaller("sweep")),
            self._publish_metrics(),
        ]

    def host_events(self) -> list[iam.PolicyStatement]:
        """An AWS Health event: find the running jobs on its instances (of the platforms whose hosts are instances)
        and read their checkpoint lines; nothing is acted on (the sweeper moves the jobs that opted in)."""
        hosted = [p for p in self.platforms if p.instance_hosts]
        logs = [s for p in hosted for s in p.read_logs()]
        return _unique([in_this_region("DescribeInstances", ["ec2:DescribeInstances"]), *logs])

    def slack_interactions(self) -> list[iam.PolicyStatement]:
        """A button pressed in Slack: read the job, maybe stop it ("Stop now")."""
        return [*self._read_jobs(), *self._stop()]

    def _each(self, grants: Callable[[PlatformStack], list[iam.PolicyStatement]]) -> list[iam.PolicyStatement]:
        """One grant of every watched platform, each statement once (two platforms may need the same)."""
        return _unique(s for platform in self.platforms for s in grants(platform))

    def _read_jobs(self) -> list[iam.PolicyStatement]:
        return self._each(methodcaller("read_jobs"))

    def _read_logs(self) -> list[iam.PolicyStatement]:
        return self._each(methodcaller("read_logs"))

    def _stop(self) -> list[iam.PolicyStatement]:
        conditions = STOP_OPT_IN_CONDITION if self.policy.stop_requires_tag else None
        return self._each(methodcaller("stop", conditions))

    def _resume(self) -> list[iam.PolicyStatement]:
        return self._each(methodcaller("resume"))

    def _manage_alarms(self) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="ManageStallwatchAlarms",
                actions=["cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:TagResource"],
                resources=[self.alarm_arn(f"{self.config.alarm_prefix}*")],
            ),
            self._describe_alarms(),
        ]

    def _describe_alarms(self) -> iam.PolicyStatement:
        # Read-only; DescribeAlarms by name prefix is authorized against every alarm of the account and region.
        return iam.PolicyStatement(
            sid="DescribeAlarms", actions=["cloudwatch:DescribeAlarms"], resources=[self.alarm_arn("*")]
        )

    def _read_metrics(self) -> iam.PolicyStatement:
        # GetMetricData has no resource-level permissions.
        return in_this_region("ReadMetrics", ["cloudwatch:GetMetricData"])

    def _publish_metrics(self) -> iam.PolicyStatement:
        # PutMetricData has no resource-level permissions; the namespace condition keeps it to Stallwatch's.
        return iam.PolicyStatement(
            sid="PublishStallwatchMetrics",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": NAMESPACE}},
        )

    def alarm_arn(self, name: str) -> str:
        """The ARN of the alarm(s) `name` (may end in `*`) in this stack's account and region."""
        return self.stack.format_arn(
            service="cloudwatch", resource="alarm", resource_name=name, arn_format=ArnFormat.COLON_RESOURCE_NAME
        )


def _unique(statements: Iterable[iam.PolicyStatement]) -> list[iam.PolicyStatement]:
    """The statements, each once (by its JSON), in their order."""
    seen: dict[str, iam.PolicyStatement] = {}
    for statement in statements:
        seen.setdefault(json.dumps(statement.to_json(), sort_keys=True, default=str), statement)
    return list(seen.values())
