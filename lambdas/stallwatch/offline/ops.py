"""Operator commands against a deployed Stallwatch: incidents, snoozes and the effective policy.

    stallwatch incidents --since 24h                    # the deployment's incidents, newest first
    stallwatch incidents --job my-job
    stallwatch status my-job                            # its state and latest decision: why, and where each rank is;
                                                        # an AWS Health event for one of its instances, and its move
    stallwatch snooze my-job --for 2h                   # audited with your IAM identity
    stallwatch policy show my-job                       # the policy after the job's stallwatch:* tags

The table and the deployed config are found through the CloudFormation stack (``--stack``, default
``stallwatch``); ``--table`` / ``STALLWATCH_TABLE`` and ``--config FILE`` override them. ``--region`` and
``--profile`` choose the account. `register(subparsers)` adds the commands to the ``stallwatch`` CLI.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stallwatch.aws.host_events import HostEvents
from stallwatch.aws.job_states import JobStates
from stallwatch.aws.store import Store, job_key
from stallwatch.core.config import CONFIG_ENV, StallwatchConfig
from stallwatch.core.health_events import HostNotice, status_line
from stallwatch.core.platforms import DEFAULT, job_name_error
from stallwatch.core.policy import MODE_TAG, TAG_PREFIX, EffectivePolicy, Thresholds
from stallwatch.core.signals import Platform

DEFAULT_STACK = "stallwatch"
TABLE_ENV = "STALLWATCH_TABLE"
TABLE_RESOURCE_TYPE = "AWS::DynamoDB::Table"
FUNCTION_RESOURCE_TYPE = "AWS::Lambda::Function"
INCIDENT_PREFIX = "incident#"
AUDIT_PREFIX = "audit#"
STATUS_PAGE = 20  # audit records a page while `status` looks for the newest decision
STATUS_FRAMES = 6  # frames per place in `status`'s stacks table
AUDIT_TRIGGER = "cli"
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
DURATION_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
STATUS_STYLES = {"open": "bold red", "closed": "green"}
# What a job argument is, on each platform (with --platform ec2: the tag, or an untagged instance's id).
JOB_HELP = "a SageMaker training job's name; with --platform ec2, an EC2 job's stallwatch:job tag (or an instance id)"


class OpsError(ValueError):
    """What an ops command cannot do: no such stack, table, config or job, or AWS refused (the CLI exits 2)."""


def reported(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """AWS errors and unknown jobs as `OpsError`, so the CLI prints one line instead of a traceback."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        # imported here: the replay commands need no AWS SDK
        from botocore.exceptions import BotoCoreError, ClientError

        from stallwatch.aws.source import JobNotFoundError

        try:
            return run(args)
        except (BotoCoreError, ClientError, JobNotFoundError) as exc:
            raise OpsError(str(exc)) from exc

    return wrapper


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``7d`` as seconds; `argparse.ArgumentTypeError` names a bad value."""
    match = DURATION_PATTERN.match(text.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive duration like 30m, 2h or 7d: {text!r}")
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]


def job_name(text: str) -> str:
    """A job argument: a name SageMaker or EC2 allows, checked before anything is asked of AWS."""
    error = job_name_error(text)
    if error is not None:
        raise argparse.ArgumentTypeError(error)
    return text


def _when(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass
class Deployment:
    """One deployed Stallwatch: its account (region/profile), stack, table and config."""

    region: str | None = None
    profile: str | None = None
    stack: str = DEFAULT_STACK
    table_name: str | None = None
    config_file: Path | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Deployment:
        return cls(args.region, args.profile, args.stack, args.table or os.environ.get(TABLE_ENV), args.config)

    @functools.cached_property
    def clients(self) -> Any:
        # imported here: the replay commands need no AWS SDK
        import boto3

        from stallwatch.aws.clients import AwsClients

        clients = AwsClients(region=self.region)
        clients.session = boto3.Session(profile_name=self.profile, region_name=self.region)
        return clients

    def resources(self, resource_type: str) -> list[str]:
        """The physical ids of the stack's resources of `resource_type`."""
        cloudformation = self.clients.session.client("cloudformation", config=self.clients.config)
        try:
            resources = cloudformation.describe_stack_resources(StackName=self.stack)["StackResources"]
        except cloudformation.exceptions.ClientError as exc:
            raise OpsError(f"stack {self.stack!r}: {exc.response['Error']['Message']}") from exc
        return [
            r["PhysicalResourceId"]
            for r in resources
            if r["ResourceType"] == resource_type and r.get("PhysicalResourceId")
        ]

    @functools.cached_property
    def table(self) -> str:
        if self.table_name:
            return self.table_name
        tables = self.resources(TABLE_RESOURCE_TYPE)
        if len(tables) != 1:
            raise OpsError(f"stack {self.stack!r} has {len(tables)} tables; pass --table")
        return tables[0]

    @functools.cached_property
    def config(self) -> StallwatchConfig:
        """From --config, else the deployed functions' ``STALLWATCH_CONFIG``."""
        if self.config_file is not None:
            return StallwatchConfig.model_validate_json(self.config_file.read_text(encoding="utf-8"))
        lambda_client = self.clients.session.client("lambda", config=self.clients.config)
        for function in self.resources(FUNCTION_RESOURCE_TYPE):
            env = lambda_client.get_function_configuration(FunctionName=function).get("Environment", {})
            raw = env.get("Variables", {}).get(CONFIG_ENV)
            if raw:
                return StallwatchConfig.model_validate_json(raw)
        raise OpsError(f"no function of stack {self.stack!r} has {CONFIG_ENV}; pass --config FILE")

    def store(self, ttl_days: int | None = None) -> Store:
        days = ttl_days if ttl_days is not None else StallwatchConfig().incident_ttl_days
        return Store(self.clients.dynamodb, self.table, days)

    def store_if_deployed(self) -> Store | None:
        """The table when the deployment has one; None when none answers (a `--config` file without a stack: the
        platforms whose jobs are read from the cloud need none)."""
        try:
            return self.store()
        except OpsError:
            return None


# ---- incidents --------------------------------------------------------------------------------------------------


def incidents(deployment: Deployment, job: str | None, platform: Platform, since: float) -> list[dict[str, Any]]:
    """Incidents opened at or after `since` (epoch seconds), of one job or of all, newest first."""
    dynamodb = deployment.clients.dynamodb
    values = {":inc": {"S": INCIDENT_PREFIX}, ":since": {"N": f"{since:.3f}"}}
    if job:
        values[":pk"] = {"S": job_key(platform, job)}
        request = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :inc)",
            "FilterExpression": "opened_at >= :since",
        }
        pages = dynamodb.get_paginator("query").paginate(
            TableName=deployment.table, ExpressionAttributeValues=values, **request
        )
    else:
        pages = dynamodb.get_paginator("scan").paginate(
            TableName=deployment.table,
            FilterExpression="begins_with(sk, :inc) AND opened_at >= :since",
            ExpressionAttributeValues=values,
        )
    rows = [_incident(item) for page in pages for item in page["Items"]]
    return sorted(rows, key=lambda r: r["opened_at"], reverse=True)


def _incident(item: dict[str, Any]) -> dict[str, Any]:
    """An incident item as a row: job and platform from the key, times as floats, reasons decoded."""
    plain = {name: next(iter(value.values())) for name, value in item.items()}
    _, platform, job = plain["pk"].split("#", 2)
    return {
        "job": job,
        "platform": platform,
        "status": plain.get("status", ""),
        "diagnosis": plain.get("diagnosis", ""),
        "opened_at": float(plain["opened_at"]),
        "closed_at": float(plain["closed_at"]) if "closed_at" in plain else None,
        "close_reason": plain.get("close_reason", ""),
        "reasons": json.loads(plain.get("reasons", "[]")),
    }


@reported
def run_incidents(args: argparse.Namespace) -> int:
    deployment = Deployment.from_args(args)
    rows = incidents(deployment, args.job, args.platform, time.time() - args.since)
    table = Table(title=f"Incidents in {deployment.table} ({len(rows)})", header_style="bold")
    for column in ("opened", "job", "platform", "status", "diagnosis", "closed", "why"):
        table.add_column(column, overflow="fold")
    for row in rows:
        closed = f"{_when(row['closed_at'])} ({row['close_reason']})" if row["closed_at"] else ""
        table.add_row(
            _when(row["opened_at"]),
            row["job"],
            row["platform"],
            f"[{STATUS_STYLES.get(row['status'], '')}]{row['status']}[/]",
            row["diagnosis"],
            closed,
            Text("; ".join(row["reasons"])),  # plain text: reasons quote tags and log-derived evidence
        )
    Console().print(table)
    return 0


# ---- status -----------------------------------------------------------------------------------------------------


def latest_decision(deployment: Deployment, job: str, platform: Platform) -> dict[str, Any] | None:
    """The job's newest audit record of a decision (one Query, newest first), or None if it was never decided."""
    pages = deployment.clients.dynamodb.get_paginator("query").paginate(
        TableName=deployment.table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :audit)",
        ExpressionAttributeValues={":pk": {"S": job_key(platform, job)}, ":audit": {"S": AUDIT_PREFIX}},
        ScanIndexForward=False,
        PaginationConfig={"PageSize": STATUS_PAGE},
    )
    for page in pages:
        for item in page["Items"]:
            record = json.loads(item["record"]["S"])
            if "diagnosis" in record:  # operators' snoozes and resumes are audited beside the decisions
                return record | ({"outcome": json.loads(item["outcome"]["S"])} if "outcome" in item else {})
    return None


def stacks_table(stacks: dict[str, Any]) -> Table:
    """Where the ranks were at the decision (the agent's stack dumps), the odd ones out first."""
    dumped = f"{stacks['ranks']} rank{'s' if stacks['ranks'] != 1 else ''} dumped"
    table = Table(title=f"Stacks ({dumped})", title_justify="left", header_style="bold")
    for column in ("", "ranks", "hosts", "collective", "innermost frames"):
        table.add_column(column, overflow="fold")
    for group in stacks["groups"]:
        ranks = ", ".join(str(r) for r in group["ranks"]) + (" ..." if group["count"] > len(group["ranks"]) else "")
        seq = group.get("collective") or {}
        table.add_row(
            Text("odd one out" if group["odd"] else "", style="bold red"),
            Text(f"{group['count']}: {ranks}"),
            Text(", ".join(group["hosts"])),
            Text(f"{seq['op']} seq {seq['seq']}" if seq else group.get("op") or ""),
            Text("\n".join(group["frames"][:STATUS_FRAMES])),  # plain text: frames quote the job's source
        )
    return table


def host_notices(deployment: Deployment, job: str, platform: Platform, now: float) -> list[HostNotice]:
    """The job's AWS Health notices whose window is not over yet (`runtime.health`), the nearest first."""
    notices = HostEvents(deployment.store()).notices(job_key(platform, job))
    return sorted((n for n in notices if n.over_at > now), key=lambda n: n.start)


@reported
def run_status(args: argparse.Namespace) -> int:
    deployment = Deployment.from_args(args)
    state = JobStates(deployment.store()).load(job_key(args.platform, args.job))
    decision = latest_decision(deployment, args.job, args.platform)
    now = time.time()
    notices = host_notices(deployment, args.job, args.platform, now)
    if args.json:
        found = {"job": args.job, "state": asdict(state.state), "incident": state.incident, "decision": decision}
        print(json.dumps(found | {"host_events": [n.as_json() for n in notices]}))
        return 0
    console = Console()
    for notice in notices:
        console.print(Text(status_line(notice, now), style="yellow"))  # plain text: the event's code as AWS wrote it
    if decision is None:
        console.print(Text(f"{args.job}: never decided by Stallwatch ({deployment.table})"))
        return 0
    head = (
        f"{args.job} ({args.platform.value}): {decision['diagnosis']}, {decision['action']} at {_when(decision['at'])}"
    )
    console.print(Text(head, style="bold"))
    if state.incident:
        console.print(Text(f"open incident since {_when(state.state.stall_since)}"))
    for reason in decision.get("reasons", []):
        console.print(Text(f"- {reason}"))  # plain text: reasons quote log lines and frames
    stacks = (decision.get("evidence") or {}).get("stacks") or {}
    if stacks.get("groups"):
        console.print(stacks_table(stacks))
    return 0


# ---- snooze -----------------------------------------------------------------------------------------------------


def snooze(deployment: Deployment, job: str, platform: Platform, seconds: float, now: float) -> float:
    """Snooze a running job until `now + seconds`, audited with the caller's IAM identity; returns the end."""
    # imported here: only the commands that touch a job need the AWS source and the state writer
    from stallwatch.aws.platforms import adapter

    adapter(platform, deployment.clients, store=deployment.store()).facts(job)  # JobNotFoundError on a typo first
    operator = deployment.clients.session.client("sts").get_caller_identity()["Arn"]
    until = now + seconds
    audit = {
        "at": now,
        "job": job,
        "platform": platform.value,
        "trigger": AUDIT_TRIGGER,
        "operator": operator,
        "action": "snooze",
        "snoozed_until": until,
    }
    ttl_days = deployment.config.incident_ttl_days if deployment.config_file else None
    states = JobStates(deployment.store(ttl_days))
    states.change_state(job_key(platform, job), lambda s: s.snoozed(until), audit, now, f"cli#{uuid.uuid4().hex}")
    return until


@reported
def run_snooze(args: argparse.Namespace) -> int:
    until = snooze(Deployment.from_args(args), args.job, args.platform, args.duration, time.time())
    Console().print(f"[bold]{args.job}[/] snoozed until {_when(until)} (no stop before then; alerts continue)")
    return 0


# ---- policy show ------------------------------------------------------------------------------------------------


def effective_policy(deployment: Deployment, job: str | None, platform: Platform) -> tuple[EffectivePolicy, dict]:
    """The deployed policy, after `job`'s tags when given; and the tags."""
    # imported here: see `snooze`
    from stallwatch.aws.platforms import adapter

    config = deployment.config
    tags = (
        adapter(platform, deployment.clients, config, deployment.store_if_deployed()).facts(job).tags if job else {}
    )  # an EC2 job's: merged over its instances
    return config.policy.for_job(tags), tags


def policy_rows(effective: EffectivePolicy, tags: dict[str, str]) -> list[tuple[str, str, str]]:
    """(setting, value, source) per setting; source is ``tag``, ``config`` or ``default``."""
    defaults = Thresholds()
    bad = {error.split("=", 1)[0] for error in effective.tag_errors}
    mode_source = "tag" if MODE_TAG in tags and MODE_TAG not in bad else "config"
    rows = [("mode", effective.mode.value, mode_source), ("may stop", str(effective.may_stop).lower(), "derived")]
    for name in Thresholds.model_fields:
        tag = f"{TAG_PREFIX}{name.replace('_', '-')}"
        value = getattr(effective.thresholds, name)
        if tag in tags and tag not in bad:
            source = "tag"
        else:
            source = "default" if value == getattr(defaults, name) else "config"
        rows.append((name, f"{value:g}" if isinstance(value, float) else str(value), source))
    return rows


@reported
def run_policy_show(args: argparse.Namespace) -> int:
    effective, tags = effective_policy(Deployment.from_args(args), args.job, args.platform)
    source = f"the policy of {args.config}" if args.config else f"the policy deployed in {args.stack}"
    title = (
        f"Effective policy of {args.job}: {source}" if args.job else f"{source[0].upper()}{source[1:]} (no job tags)"
    )
    table = Table(title=title, header_style="bold")
    for column in ("setting", "value", "source"):
        table.add_column(column)
    for setting, value, source in policy_rows(effective, tags):
        table.add_row(setting, value, f"[bold]{source}[/]" if source == "tag" else source)
    console = Console()
    console.print(table)
    for error in effective.tag_errors:
        console.print(Text.assemble(("tag ignored: ", "yellow"), error))  # the tag's value as written
    return 0


# ---- argparse ---------------------------------------------------------------------------------------------------


def deployment_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", help="AWS region of the deployment (default: the environment's)")
    parser.add_argument("--profile", help="AWS profile (default: the environment's credentials)")
    parser.add_argument("--stack", default=DEFAULT_STACK, help=f"the Stallwatch stack (default {DEFAULT_STACK})")
    parser.add_argument("--table", help=f"the DynamoDB table (default: ${TABLE_ENV}, else the stack's)")
    parser.add_argument("--config", type=Path, metavar="FILE", help="StallwatchConfig JSON instead of the deployed")


def _job_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", type=Platform, choices=list(Platform), default=DEFAULT, help=f"default {DEFAULT}")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``incidents``, ``status``, ``snooze`` and ``policy show`` to the ``stallwatch`` CLI."""
    parser = subparsers.add_parser("incidents", help="incidents of the deployed Stallwatch, newest first")
    parser.add_argument("--job", type=job_name, help=f"only this job ({JOB_HELP})")
    parser.add_argument(
        "--since", type=parse_duration, default=parse_duration("24h"), metavar="DURATION", help="default 24h"
    )
    _job_flags(parser)
    deployment_flags(parser)
    parser.set_defaults(handler=run_incidents)

    parser = subparsers.add_parser(
        "status", help="a job's state and latest decision (why, where each rank is), and its hosts' AWS Health events"
    )
    parser.add_argument("job", metavar="JOB", type=job_name, help="SageMaker training job name or EC2 job")
    parser.add_argument("--json", action="store_true", help="print the state and the decision's record as JSON")
    _job_flags(parser)
    deployment_flags(parser)
    parser.set_defaults(handler=run_status)

    parser = subparsers.add_parser("snooze", help="no stop for a job until the snooze ends")
    parser.add_argument("job", metavar="JOB", type=job_name, help=JOB_HELP)
    parser.add_argument("--for", dest="duration", type=parse_duration, required=True, metavar="DURATION")
    _job_flags(parser)
    deployment_flags(parser)
    parser.set_defaults(handler=run_snooze)

    policy = subparsers.add_parser("policy", help="the deployed policy").add_subparsers(
        dest="policy_command", required=True, metavar="COMMAND"
    )
    parser = policy.add_parser("show", help="the effective policy, after JOB's stallwatch:* tags")
    parser.add_argument("job", nargs="?", metavar="JOB", type=job_name, help="apply this job's tags")
    _job_flags(parser)
    deployment_flags(parser)
    parser.set_defaults(handler=run_policy_show)
