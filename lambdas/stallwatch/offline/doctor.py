"""``stallwatch doctor``: is a deployed Stallwatch working? One line per check, with what to do about a failure.

    stallwatch doctor                      # the default deployment (stack "stallwatch"), with your AWS credentials
    stallwatch doctor --stack team-b --send-test-alert   # and a test message through on_alarm to Slack
    stallwatch doctor --local              # the local demo's deployment on moto: what passing looks like

The checks, in order: the stack's functions, rules (the sweeper's schedule among them) and table exist and are
ready; the Slack secret holds what its mode needs; Slack answers (``auth.test`` for a bot token; the webhook, sent an
empty payload, which Slack refuses without posting); IAM allows the stops and resumes only under their tags
(``iam:SimulatePrincipalPolicy`` of each function's role, with and without the tag); the sweeper ran recently and
without errors; the health topic lets this account's health alarms (and no other's) publish, its key lets them
encrypt, and someone has confirmed a subscription; each running EC2 job's CloudWatch agent publishes GPU power; with
Slurm watched, the job events' rule and the log group exist, each cluster's runner answers a ping through the table,
and a running Slurm job is heard of; each training log group the deployment subscribes holds its fatal-line filter to
on_log_line (or why not: the group's two slots taken by other filters, named).
`--send-test-alert` invokes on_alarm with a test event: a fake job's alert, marked as a test, reaches Slack through
the function's own credentials, and nothing is stopped. `--subscribe` puts the fatal-line filter where it is missing
and a slot is free. Exit code 1 if any check fails.

IAM needed besides `stallwatch incidents`'s: cloudformation:DescribeStackResources, lambda:GetFunctionConfiguration
(and lambda:InvokeFunction of on_alarm for the test alert), events:DescribeRule, dynamodb:DescribeTable,
secretsmanager:GetSecretValue of the Slack secret, iam:SimulatePrincipalPolicy of the functions' roles,
cloudwatch:GetMetricData, sts:GetCallerIdentity, sns:GetTopicAttributes of the health topic, kms:GetKeyPolicy of its
key, cloudwatch:DescribeAlarms, cloudwatch:ListMetrics, ec2:DescribeInstances; with Slurm, logs:DescribeLogGroups and
dynamodb:Query, PutItem, GetItem and DeleteItem of the table (the runners' ping);
logs:DescribeSubscriptionFilters of the training log groups (and logs:CreateLogGroup, logs:PutSubscriptionFilter for
`--subscribe`).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from stallwatch.aws import log_subscriptions
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs
from stallwatch.aws.platforms.slurm_runner import Runners
from stallwatch.core.alarms import host_names
from stallwatch.core.config import (
    FATAL_LINES_FILTER,
    SlackMode,
    StallwatchConfig,
    slack_mode_of,
)
from stallwatch.core.contract import CWAGENT_DIM_INSTANCE, CWAGENT_GPU_POWER, CWAGENT_NAMESPACE, SLURM_EVENT_SOURCE
from stallwatch.core.platforms import DESCRIPTIONS, slurm_runner, subscribed_log_groups
from stallwatch.core.platforms.interface import PlatformDescription
from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE
from stallwatch.offline import ops

HANDLERS = {
    "on_alarm": "handlers.on_alarm.handler",
    "on_job_state": "handlers.on_job_state.handler",
    "sweeper": "handlers.sweeper.handler",
    "slack_interactions": "handlers.slack_interactions.handler",
    "on_log_line": "handlers.on_log_line.handler",
}
SERVICE_ENV = "POWERTOOLS_SERVICE_NAME"  # the functions' deployment name
SUBSCRIPTION_DOCS = 'docs/deploy.md, "Fatal lines wake the engine"'
RULE_RESOURCE_TYPE = "AWS::Events::Rule"
BUS_RESOURCE_TYPE = "AWS::Events::EventBus"
SLACK_SECRET_ENV = "SLACK_SECRET_ARN"
SLACK_API_URL = "https://slack.com/api/"
SLACK_TIMEOUT_S = 10
# An empty payload to a live incoming webhook is refused without a post; these answers say the webhook is gone.
DEAD_WEBHOOK = ("no_service", "invalid_token", "channel_not_found", "channel_is_archived", "no_team", "team_disabled")
PROBE_JOB = "stallwatch-doctor-probe"
PROBE_INSTANCE = "i-00000000000000000"
RESUME_TAG = "stallwatch:resume"
RESUMED_FROM_TAG = "stallwatch:resumed-from"
SWEEPS_LOOKED_AT = 3  # the sweeper's last run is recent: within this many sweeper periods
TEST_ALERT_KEY = "stallwatch_test_alert"
RUNNER_PING_WAIT_S = 30.0  # a runner polls every 5 s; one that has not answered a ping by then is down
RUNNER_PING_POLL_S = 1.0
TOPIC_RESOURCE_TYPE = "AWS::SNS::Topic"
CLOUDWATCH_PRINCIPAL = "cloudwatch.amazonaws.com"
# What CloudWatch needs to notify an encrypted topic: publish to it, and encrypt with its key.
TOPIC_ACTIONS = ("sns:Publish",)
KEY_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")
PROBE_ALARM = "probe"  # a health alarm's name after the prefix, where the stack's alarms cannot be listed
OTHER_ACCOUNT = "000000000000"  # an account the grants must not serve (the confused deputy)
# The checkout the CLI runs from (an editable install of lambdas/): where --local finds the demo's deployment.
LOCAL_CHECKOUT = Path(__file__).resolve().parents[3]


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


STYLES = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: what was checked, how it went, and the fix for a warning or failure."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class Deployed:
    """What the doctor found of the stack: its functions by role (on_alarm, ...), their configurations, its rules."""

    deployment: ops.Deployment
    functions: dict[str, dict[str, Any]]
    rules: list[dict[str, Any]]
    table: str

    @classmethod
    def find(cls, deployment: ops.Deployment) -> Deployed:
        lambda_client = deployment.clients.session.client("lambda", config=deployment.clients.config)
        events = deployment.clients.session.client("events", config=deployment.clients.config)
        functions = {}
        for name in deployment.resources(ops.FUNCTION_RESOURCE_TYPE):
            configuration = lambda_client.get_function_configuration(FunctionName=name)
            role = next((r for r, handler in HANDLERS.items() if handler == configuration.get("Handler")), None)
            if role is not None:
                functions[role] = configuration
        buses = deployment.resources(BUS_RESOURCE_TYPE)
        rules = [_describe_rule(events, name, buses) for name in deployment.resources(RULE_RESOURCE_TYPE)]
        return cls(deployment, functions, rules, deployment.table)

    def env(self, variable: str) -> str | None:
        return next((f["Environment"]["Variables"].get(variable) for f in self.functions.values()), None)


def _describe_rule(events: Any, physical_id: str, buses: list[str]) -> dict[str, Any]:
    """A rule of the stack, by its physical id: ``<bus>|<name>`` on a bus of its own (CloudFormation's id of a rule
    on the Slurm bus), else ``<name>`` on the default bus or, failing that, one of the stack's buses (every bus of
    the account where the stack names none)."""
    bus, _, name = physical_id.rpartition("|")
    others = buses or [b["Name"] for b in events.list_event_buses().get("EventBuses", []) if b["Name"] != "default"]
    for candidate in [bus] if bus else ["default", *others]:
        try:
            return dict(events.describe_rule(Name=name, EventBusName=candidate))
        except events.exceptions.ResourceNotFoundException:
            continue
    return {"Name": name, "State": "NOT FOUND"}


def check_resources(deployed: Deployed, config: StallwatchConfig) -> Iterator[Check]:
    """The functions (active), the rules each monitored platform and the sweeper need (enabled), the table."""
    redeploy = f"deploy the stack again: npx cdk deploy {deployed.deployment.stack}"
    for role in HANDLERS:
        function = deployed.functions.get(role)
        if function is None:
            yield Check(f"function {role}", Status.FAIL, "not in the stack", redeploy)
        elif function.get("State", "Active") != "Active" or function.get("LastUpdateStatus", "Successful") == "Failed":
            detail = f"{function['FunctionName']}: {function.get('State')} {function.get('StateReason', '')}".strip()
            yield Check(f"function {role}", Status.FAIL, detail, redeploy)
        else:
            yield Check(f"function {role}", Status.OK, function["FunctionName"])
    wanted = {"sweeper schedule": lambda r: bool(r.get("ScheduleExpression"))}
    if config.policy.monitor_sagemaker:
        wanted["SageMaker job states rule"] = lambda r: (
            "SageMaker Training Job State Change" in r.get("EventPattern", "")
        )
    if config.policy.monitor_ec2:
        wanted["EC2 instance states rule"] = lambda r: "aws.ec2" in r.get("EventPattern", "")
    if config.policy.monitor_slurm:
        wanted["Slurm job events rule"] = lambda r: SLURM_EVENT_SOURCE in r.get("EventPattern", "")
    for name, matches in wanted.items():
        rule = next((r for r in deployed.rules if matches(r)), None)
        if rule is None:
            yield Check(name, Status.FAIL, "not in the stack", redeploy)
        elif rule.get("State") != "ENABLED":
            fix = f"aws events enable-rule --name {rule['Name']}"
            yield Check(name, Status.FAIL, f"{rule['Name']} is {rule.get('State')}", fix)
        else:
            yield Check(name, Status.OK, f"{rule['Name']} {rule.get('ScheduleExpression', '')}".strip())
    status = deployed.deployment.clients.dynamodb.describe_table(TableName=deployed.table)["Table"]["TableStatus"]
    if status == "ACTIVE":
        yield Check("table", Status.OK, f"{deployed.table} {status}")
    else:
        yield Check("table", Status.FAIL, f"{deployed.table} {status}", redeploy)


def read_secret(deployed: Deployed) -> tuple[Check, dict[str, Any] | None]:
    """The Slack secret's fields, as the functions read them."""
    arn = deployed.env(SLACK_SECRET_ENV)
    fix = "put the Slack app's JSON into the secret (docs/operators.md, step 6)"
    if not arn:
        return Check("Slack secret", Status.FAIL, f"the functions have no {SLACK_SECRET_ENV}", "deploy again"), None
    try:
        raw = deployed.deployment.clients.secretsmanager.get_secret_value(SecretId=arn)["SecretString"]
        secret = json.loads(raw)
    except ValueError:
        return Check("Slack secret", Status.FAIL, f"{arn} does not hold JSON", fix), None
    if not isinstance(secret, dict):
        return Check("Slack secret", Status.FAIL, f"{arn} does not hold a JSON object", fix), None
    return Check("Slack secret", Status.OK, arn), secret


def check_secret_fields(secret: dict[str, Any], config: StallwatchConfig) -> Iterator[Check]:
    """The fields the secret's mode needs, the signing secret the buttons need, and the allow-list."""
    mode = slack_mode_of(secret)
    if mode is None:
        fix = '{"webhook_url": ..., "signing_secret": ...} or {"bot_token": "xoxb-...", "channel": "C...", ...}'
        yield Check("Slack mode", Status.FAIL, "the secret has neither webhook_url, nor bot_token and channel", fix)
        return
    both = mode is SlackMode.WEBHOOK and secret.get("bot_token")
    detail = f"{mode.value} (webhook_url set: alerts cannot be edited in place)" if both else mode.value
    fix = "remove webhook_url from the secret for bot mode" if both else ""
    yield Check("Slack mode", Status.WARN if both else Status.OK, detail, fix)
    if not secret.get("signing_secret"):
        fix = "add the app's signing_secret (Basic Information → Signing Secret) to the secret"
        yield Check("Slack signing secret", Status.FAIL, "missing: every button press is refused (401)", fix)
    else:
        yield Check("Slack signing secret", Status.OK, "set")
    allowed = config.slack
    if allowed.allowed_group_ids and mode is not SlackMode.BOT:
        fix = "groups need bot mode (usergroups.users.list): use a bot_token, or list the users"
        yield Check("Slack allow-list", Status.FAIL, "allowed_group_ids set in webhook mode", fix)
    elif not (allowed.allowed_user_ids or allowed.allowed_group_ids):
        fix = "set slack.allowed_user_ids (or allowed_group_ids) in the config and deploy again"
        yield Check("Slack allow-list", Status.WARN, "empty: every button answers 'not allowed'", fix)
    else:
        count = len(allowed.allowed_user_ids) + len(allowed.allowed_group_ids)
        yield Check("Slack allow-list", Status.OK, f"{count} users and groups")


def check_slack(secret: dict[str, Any], api_url: str) -> Check:
    """Slack answers the secret's credentials: auth.test for a bot token, the webhook for an empty payload."""
    mode = slack_mode_of(secret)
    if mode is SlackMode.BOT:
        from slack_sdk import WebClient  # imported here: only this check talks to Slack
        from slack_sdk.errors import SlackApiError

        try:
            reply = WebClient(token=secret["bot_token"], base_url=api_url, timeout=SLACK_TIMEOUT_S).auth_test()
        except SlackApiError as exc:
            fix = "a token of the app that posts (OAuth & Permissions → Bot User OAuth Token)"
            return Check("Slack answers", Status.FAIL, f"auth.test: {exc.response.get('error')}", fix)
        except OSError as exc:
            return Check("Slack answers", Status.FAIL, f"auth.test: {exc}", "check the network path to Slack")
        return Check("Slack answers", Status.OK, f"auth.test: bot {reply.get('user')} in team {reply.get('team')}")
    request = urllib.request.Request(
        secret["webhook_url"], data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=SLACK_TIMEOUT_S) as response:
            status, body = response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return Check("Slack answers", Status.FAIL, f"webhook: {exc}", "check the network path to Slack")
    if status >= 500 or body.strip() in DEAD_WEBHOOK or status in (403, 404, 410):
        fix = "the webhook was removed or revoked: install the app again and put the new webhook_url"
        return Check("Slack answers", Status.FAIL, f"webhook: HTTP {status} {body[:80]}", fix)
    return Check("Slack answers", Status.OK, f"webhook answers (HTTP {status} to an empty payload, nothing posted)")


@dataclass(frozen=True)
class Probe:
    """One IAM question: may `role` do `action` on `resource` with `tags` (context keys), and should it."""

    role: str
    action: str
    resource: str
    tags: dict[str, str]
    allowed: bool


def iam_probes(config: StallwatchConfig, region: str, account: str) -> list[Probe]:
    """Stops (on_alarm, the sweeper, the buttons) with and without the opt-in tag; resumes (on_job_state, the
    sweeper) with and without theirs."""
    job = f"arn:aws:sagemaker:{region}:{account}:training-job/{PROBE_JOB}"
    instance = f"arn:aws:ec2:{region}:{account}:instance/{PROBE_INSTANCE}"
    role_arn = f"arn:aws:iam::{account}:role/{PROBE_JOB}"
    tagged = {f"aws:ResourceTag/{STOP_OPT_IN_TAG}": STOP_OPT_IN_VALUE}
    untagged_allowed = not config.policy.stop_requires_tag
    probes = []
    for role in ("on_alarm", "sweeper", "slack_interactions"):
        if config.policy.monitor_sagemaker:
            probes += [
                Probe(role, "sagemaker:StopTrainingJob", job, tagged, True),
                Probe(role, "sagemaker:StopTrainingJob", job, {}, untagged_allowed),
            ]
        if config.policy.monitor_ec2:
            probes += [
                Probe(role, "ec2:StopInstances", instance, tagged, True),
                Probe(role, "ec2:StopInstances", instance, {}, untagged_allowed),
            ]
    for role in ("on_job_state", "sweeper"):
        if config.policy.monitor_sagemaker:
            chain = {f"aws:RequestTag/{RESUMED_FROM_TAG}": PROBE_JOB}
            passed = {"iam:PassedToService": "sagemaker.amazonaws.com"}
            probes += [
                Probe(role, "sagemaker:CreateTrainingJob", job, chain, True),
                Probe(role, "sagemaker:CreateTrainingJob", job, {}, False),
                Probe(role, "iam:PassRole", role_arn, passed | {f"aws:ResourceTag/{RESUME_TAG}": "2"}, True),
                Probe(role, "iam:PassRole", role_arn, passed, False),
            ]
        if config.policy.monitor_ec2:
            probes += [
                Probe(role, "ec2:StartInstances", instance, {f"aws:ResourceTag/{RESUME_TAG}": "2"}, True),
                Probe(role, "ec2:StartInstances", instance, {}, False),
            ]
    return probes


def check_iam(deployed: Deployed, config: StallwatchConfig, region: str, account: str) -> Iterator[Check]:
    """Each probe simulated against the function's role: allowed where it should be, denied elsewhere."""
    iam = deployed.deployment.clients.session.client("iam", config=deployed.deployment.clients.config)
    for probe in iam_probes(config, region, account):
        function = deployed.functions.get(probe.role)
        if function is None:
            continue  # reported by the resources check
        context = [
            {"ContextKeyName": key, "ContextKeyValues": [value], "ContextKeyType": "string"}
            for key, value in {"aws:RequestedRegion": region, **probe.tags}.items()
        ]
        [result] = iam.simulate_principal_policy(
            PolicySourceArn=function["Role"], ActionNames=[probe.action], ResourceArns=[probe.resource],
            ContextEntries=context,
        )["EvaluationResults"]  # fmt: skip
        allowed = result["EvalDecision"] == "allowed"
        tags = ", ".join(f"{k.split('/', 1)[-1]}={v}" for k, v in probe.tags.items() if "/" in k) or "no tag"
        name = f"IAM {probe.role} {probe.action} ({tags})"
        if allowed == probe.allowed:
            status = Status.WARN if allowed and not probe.tags and "Stop" in probe.action else Status.OK
            note = " (policy.stop_requires_tag is false: any job may be stopped)" if status is Status.WARN else ""
            yield Check(name, status, f"{result['EvalDecision']}{note}")
        else:
            want = "allowed" if probe.allowed else "denied"
            yield Check(name, Status.FAIL, f"{result['EvalDecision']}, should be {want}", "deploy the stack again")


def check_sweeper(deployed: Deployed, config: StallwatchConfig, now: float) -> Check:
    """The sweeper's invocations and errors (AWS/Lambda) over its last few periods."""
    function = deployed.functions.get("sweeper")
    if function is None:
        return Check("sweeper runs", Status.FAIL, "no sweeper function", "deploy the stack again")
    period = config.sweeper_minutes * 60
    dims = [{"Name": "FunctionName", "Value": function["FunctionName"]}]
    queries = []
    for name in ("Invocations", "Errors"):
        metric = {"Namespace": "AWS/Lambda", "MetricName": name, "Dimensions": dims}
        queries.append({"Id": name.lower(), "MetricStat": {"Metric": metric, "Period": 60, "Stat": "Sum"}})
    start = now - SWEEPS_LOOKED_AT * period - 60
    response = deployed.deployment.clients.cloudwatch.get_metric_data(
        MetricDataQueries=queries,
        StartTime=datetime.fromtimestamp(start - start % 60, UTC),
        EndTime=datetime.fromtimestamp(now + 60 - now % 60, UTC),
    )
    sums = {r["Id"]: sum(r["Values"]) for r in response["MetricDataResults"]}
    window = f"the last {SWEEPS_LOOKED_AT * config.sweeper_minutes} min"
    logs = f"see its log group /aws/lambda/{function['FunctionName']}"
    if not sums.get("invocations"):
        return Check("sweeper runs", Status.FAIL, f"no run in {window}", f"is its schedule enabled? {logs}")
    if sums.get("errors"):
        return Check(
            "sweeper runs", Status.FAIL, f"{sums['errors']:.0f} failed of {sums['invocations']:.0f} in {window}", logs
        )
    return Check("sweeper runs", Status.OK, f"{sums['invocations']:.0f} runs in {window}, no errors")


def check_health_topic(deployed: Deployed, config: StallwatchConfig, region: str, account: str) -> Iterator[Check]:
    """The health topic's policy lets this account's health alarms publish and no other account's alarms; its key
    lets them encrypt; someone has confirmed a subscription. The alarms are those named
    `config.health_alarm_prefix`... that notify the topic (a probe of that name when none is found)."""
    clients = deployed.deployment.clients
    topics = deployed.deployment.resources(TOPIC_RESOURCE_TYPE)
    redeploy = f"deploy the stack again: npx cdk deploy {deployed.deployment.stack}"
    if len(topics) != 1:
        yield Check("health topic", Status.FAIL, f"{len(topics)} SNS topics in the stack, expected 1", redeploy)
        return
    [topic] = topics
    sns = clients.session.client("sns", config=clients.config)
    attributes = sns.get_topic_attributes(TopicArn=topic)["Attributes"]
    partition = topic.split(":")[1]
    alarm_arns = _health_alarm_arns(deployed, config, topic) or [
        f"arn:{partition}:cloudwatch:{region}:{account}:alarm:{config.health_alarm_prefix}{PROBE_ALARM}"
    ]
    foreign = f"arn:{partition}:cloudwatch:{region}:{OTHER_ACCOUNT}:alarm:{config.health_alarm_prefix}{PROBE_ALARM}"
    policy = json.loads(attributes.get("Policy") or "{}")
    refused = [a for a in alarm_arns if not _serves(policy, TOPIC_ACTIONS, topic, account, a)]
    if refused:
        detail = f"CloudWatch may not publish {len(refused)} of {len(alarm_arns)} health alarms ({refused[0]})"
        yield Check("health topic policy", Status.FAIL, f"{detail}: nobody hears of a failed stop", redeploy)
    elif _serves(policy, TOPIC_ACTIONS, topic, OTHER_ACCOUNT, foreign):
        fix = "condition the cloudwatch.amazonaws.com statement on aws:SourceAccount and aws:SourceArn (redeploy)"
        yield Check("health topic policy", Status.WARN, "another account's alarms may publish to it too", fix)
    else:
        yield Check("health topic policy", Status.OK, f"CloudWatch may publish its {len(alarm_arns)} health alarms")
    yield _health_topic_key(deployed, attributes.get("KmsMasterKeyId"), account, alarm_arns, redeploy)
    confirmed = int(attributes.get("SubscriptionsConfirmed", 0))
    pending = int(attributes.get("SubscriptionsPending", 0))
    if confirmed:
        yield Check("health topic subscribers", Status.OK, f"{confirmed} confirmed")
    else:
        fix = "subscribe the on-call (notification_emails in the config, or aws sns subscribe) and confirm the mail"
        yield Check("health topic subscribers", Status.WARN, f"none confirmed ({pending} pending)", fix)


def _health_topic_key(
    deployed: Deployed, key_id: str | None, account: str, alarm_arns: list[str], redeploy: str
) -> Check:
    """The topic's KMS key lets CloudWatch encrypt for the health alarms (an unencrypted topic needs nothing)."""
    if not key_id:
        return Check("health topic key", Status.OK, "the topic is not encrypted with a key of its own")
    clients = deployed.deployment.clients
    kms = clients.session.client("kms", config=clients.config)
    policy = json.loads(kms.get_key_policy(KeyId=key_id, PolicyName="default")["Policy"])
    if all(_serves(policy, KEY_ACTIONS, "*", account, arn) for arn in alarm_arns):
        return Check("health topic key", Status.OK, f"CloudWatch may encrypt with {key_id.rsplit('/', 1)[-1]}")
    detail = "CloudWatch may not use the topic's key (kms:GenerateDataKey*, kms:Decrypt): no alarm is delivered"
    return Check("health topic key", Status.FAIL, detail, redeploy)


def _health_alarm_arns(deployed: Deployed, config: StallwatchConfig, topic: str) -> list[str]:
    """The ARNs of the deployment's health alarms that notify `topic`."""
    cloudwatch = deployed.deployment.clients.cloudwatch
    pages = cloudwatch.get_paginator("describe_alarms").paginate(AlarmNamePrefix=config.health_alarm_prefix)
    return [
        alarm["AlarmArn"]
        for page in pages
        for alarm in [*page["MetricAlarms"], *page.get("CompositeAlarms", [])]
        if topic in alarm.get("AlarmActions", [])
    ]


def _serves(policy: dict[str, Any], actions: tuple[str, ...], resource: str, account: str, alarm: str) -> bool:
    """Whether `policy` lets CloudWatch do every one of `actions` on `resource` for the alarm `alarm` of `account`
    (over TLS): an Allow that matches and no Deny that does."""
    context = {"aws:sourceaccount": account, "aws:sourcearn": alarm, "aws:securetransport": "true"}
    statements = policy.get("Statement", [])
    statements = [statements] if isinstance(statements, dict) else statements
    for action in actions:
        matching = [s for s in statements if _applies(s, action, resource, context)]
        if not any(s.get("Effect") == "Allow" for s in matching) or any(s.get("Effect") == "Deny" for s in matching):
            return False
    return True


def _applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    """Whether a policy statement is about CloudWatch doing `action` on `resource` under `context` (condition keys
    lower case). A condition operator it does not know never holds."""
    principal = statement.get("Principal")
    if principal != "*":
        named = principal.get("Service", []) if isinstance(principal, dict) else []
        aws = principal.get("AWS") if isinstance(principal, dict) else None
        if CLOUDWATCH_PRINCIPAL not in _listed(named) and "*" not in _listed(aws or []):
            return False
    if not any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in _listed(statement.get("Action", []))):
        return False
    if not any(fnmatch.fnmatchcase(resource, r) or r == "*" for r in _listed(statement.get("Resource", []))):
        return False
    for operator, tests in statement.get("Condition", {}).items():
        base = operator.removesuffix("IfExists")
        for key, wanted in tests.items():
            value = context.get(key.lower())
            if value is None:
                if base == operator:
                    return False
                continue
            if not _holds(base, value, _listed(wanted)):
                return False
    return True


def _holds(operator: str, value: str, wanted: list[str]) -> bool:
    if operator in ("StringEquals", "ArnEquals"):
        return value in wanted
    if operator in ("StringLike", "ArnLike"):
        return any(fnmatch.fnmatchcase(value, w) for w in wanted)
    if operator == "Bool":
        return value.lower() in (w.lower() for w in wanted)
    return False


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def check_agent_power(deployed: Deployed, config: StallwatchConfig) -> Iterator[Check]:
    """Each running job's instances publish GPU power (the CloudWatch agent's `nvidia_smi_power_draw`), on every
    watched platform whose hosts' power is the CloudWatch agent's (EC2): without the training agent, power is what
    tells a hung collective (busy GPUs drawing less, logs silent) from work, so the engine decides a silent hang
    sooner with it than from the job's history of silences alone."""
    for description in DESCRIPTIONS.values():
        if description.agent_power and getattr(config.policy, description.monitor_setting):
            yield from _agent_power(deployed, config, description)


def _agent_power(deployed: Deployed, config: StallwatchConfig, platform: PlatformDescription) -> Iterator[Check]:
    from stallwatch.aws.platforms import adapter  # imported here: only this check reads the jobs

    clients = deployed.deployment.clients
    source = adapter(platform.platform, clients, config)
    jobs = {name: facts or source.facts(name) for name, facts in source.running_jobs(time.time()).items()}
    if not jobs:
        yield Check(f"{platform.label} GPU power", Status.OK, f"no {platform.label} job is running")
        return
    powered = _instances_publishing(clients.cloudwatch, CWAGENT_GPU_POWER)
    fix = (
        "add \"power_draw\" to nvidia_gpu's measurement in the CloudWatch agent's configuration (deploy/ec2/"
        "cloudwatch-agent.json, the Ec2AgentConfigParameter) and restart the agent: with GPU power the engine "
        "decides a silent hang sooner"
    )
    for name, facts in jobs.items():
        hosts = host_names(facts)
        silent = [i for i in hosts if i not in powered]
        if silent:
            detail = (
                f"{len(silent)} of {len(hosts)} instances publish no {CWAGENT_GPU_POWER} "
                f"({', '.join(silent[:3])}{', ...' if len(silent) > 3 else ''})"
            )
            yield Check(f"{platform.label} GPU power {name}", Status.WARN, detail, fix)
        else:
            yield Check(f"{platform.label} GPU power {name}", Status.OK, f"{len(hosts)} instances publish it")


def _instances_publishing(cloudwatch: Any, metric: str) -> set[str]:
    """The instances the CloudWatch agent published `metric` for in the last 3 hours (ListMetrics, 500 a page)."""
    pages = cloudwatch.get_paginator("list_metrics").paginate(
        Namespace=CWAGENT_NAMESPACE, MetricName=metric, RecentlyActive="PT3H"
    )
    return {
        dimension["Value"]
        for page in pages
        for found in page["Metrics"]
        for dimension in found.get("Dimensions", [])
        if dimension["Name"] == CWAGENT_DIM_INSTANCE
    }


def check_slurm(deployed: Deployed, config: StallwatchConfig) -> Iterator[Check]:
    """A deployment that watches Slurm: each cluster's runner answers (a ping through the table, the one command path
    of every flavor), its log group exists, and its clusters' prologs are heard (a running Slurm job is known)."""
    if not config.policy.monitor_slurm:
        return
    clients = deployed.deployment.clients
    store = deployed.deployment.store()
    running = SlurmJobs(store).running()
    yield from slurm_runners(Runners(store), {job.cluster for job in running.values()})
    groups = clients.logs.describe_log_groups(logGroupNamePrefix=config.slurm_log_group)["logGroups"]
    if any(g["logGroupName"] == config.slurm_log_group for g in groups):
        yield Check("Slurm log group", Status.OK, config.slurm_log_group)
    else:
        fix = "deploy the stack again (it creates the group; the nodes' CloudWatch agent never does)"
        yield Check("Slurm log group", Status.FAIL, f"{config.slurm_log_group} does not exist", fix)
    if running:
        yield Check("Slurm job events", Status.OK, f"{len(running)} running job(s) heard of, e.g. {min(running)}")
    else:
        fix = (
            'if jobs run: on the controller, `scontrol show config | grep -E "(Prolog|Epilog)Slurmctld"` names '
            'deploy/slurm/stallwatch-events.sh, and `journalctl -t stallwatch-slurm` holds no "PutEvents failed"'
        )
        yield Check("Slurm job events", Status.WARN, "no running Slurm job was heard of", fix)


def slurm_runners(runners: Runners, running_clusters: set[str]) -> Iterator[Check]:
    """Every cluster known (its runner polled the table, or a job of it runs) is pinged: its runner must answer
    within `RUNNER_PING_WAIT_S`, or no job of it can be stopped."""
    clusters = sorted({r.cluster for r in runners.runners()} | running_clusters)
    fix = (
        "on the cluster's controller or login node: `systemctl status stallwatch-runner` and `journalctl -u "
        "stallwatch-runner` (deploy/slurm/install.sh installs it; its role needs the stack's SlurmControllerPolicyArn)"
    )
    if not clusters:
        yield Check(
            "Slurm runners", Status.WARN, "no cluster's runner ever polled this deployment: no job can be stopped", fix
        )
        return
    for cluster in clusters:
        command = slurm_runner.ping(cluster)
        ref = runners.send(command, time.time())
        deadline = time.monotonic() + RUNNER_PING_WAIT_S
        answer = runners.answer(ref)
        while answer is None and time.monotonic() < deadline:
            time.sleep(RUNNER_PING_POLL_S)
            answer = runners.answer(ref)
        runners.forget(ref)
        if answer is not None and answer.get("result") == slurm_runner.PONG:
            yield Check(f"Slurm runner {cluster}", Status.OK, f"answered from {answer.get('host', '?')}")
        else:
            said = f"answered {answer.get('result')}: {answer.get('detail', '')}" if answer else "did not answer"
            yield Check(
                f"Slurm runner {cluster}",
                Status.FAIL,
                f"{said} within {RUNNER_PING_WAIT_S:.0f} s: no job of it can be stopped",
                fix,
            )


def send_test_alert(deployed: Deployed, requested_by: str) -> Check:
    """on_alarm's test alert: a fake job's alert through the function to Slack, marked as a test; nothing stopped."""
    function = deployed.functions.get("on_alarm")
    if function is None:
        return Check("test alert", Status.FAIL, "no on_alarm function", "deploy the stack again")
    lambda_client = deployed.deployment.clients.session.client("lambda", config=deployed.deployment.clients.config)
    payload = json.dumps({TEST_ALERT_KEY: {"requested_by": requested_by}}).encode()
    answer = lambda_client.invoke(FunctionName=function["FunctionName"], Payload=payload)
    result = json.loads(answer["Payload"].read() or b"{}")
    if answer.get("FunctionError"):
        detail = f"on_alarm failed: {result.get('errorType')}: {result.get('errorMessage')}"
        return Check("test alert", Status.FAIL, detail, f"see /aws/lambda/{function['FunctionName']}")
    if not result.get("posted"):
        return Check("test alert", Status.FAIL, f"not posted: {result.get('detail')}", "see the Slack checks above")
    return Check("test alert", Status.OK, f"posted to Slack, marked as a test ({result.get('detail')})")


def check_log_subscriptions(deployed: Deployed, config: StallwatchConfig, subscribe: bool = False) -> Iterator[Check]:
    """Each subscribed log group holds our filter to on_log_line, with this deployment's pattern; or why not, and
    what to do. `subscribe`: put it where a slot is free (as the stack's custom resource does)."""
    function = deployed.functions.get("on_log_line")
    if function is None:
        return  # reported by the resources check
    logs = deployed.deployment.clients.session.client("logs", config=deployed.deployment.clients.config)
    name = FATAL_LINES_FILTER.format(deployment=function["Environment"]["Variables"].get(SERVICE_ENV, ""))
    pattern = config.policy.fatal_filter_pattern
    for group in subscribed_log_groups(config).values():
        subscription = log_subscriptions.Subscription(group, name, pattern, function["FunctionArn"])
        check = f"fatal lines of {group}"
        found = log_subscriptions.filters(logs, group)
        ours = next((f for f in found or [] if log_subscriptions.is_ours(f, subscription)), None)
        if ours is not None and ours.get("filterPattern") == pattern:
            yield Check(check, Status.OK, f"{name} → {function['FunctionName']}")
            continue
        if subscribe:
            result = log_subscriptions.subscribe(logs, subscription)
            fix = "" if result.subscribed else f"free a slot ({SUBSCRIPTION_DOCS}), then run this again"
            yield Check(check, Status.OK if result.subscribed else Status.WARN, result.detail, fix)
            continue
        if ours is not None:
            detail = f"{name}'s pattern is not this deployment's (its fatal lines changed)"
            yield Check(check, Status.WARN, detail, "deploy the stack again, or stallwatch doctor --subscribe")
        elif found is None:
            yield Check(check, Status.WARN, "the log group does not exist", "deploy the stack again")
        elif len(found) >= log_subscriptions.SUBSCRIPTION_FILTERS_PER_GROUP:
            detail = (
                f"not subscribed: both subscription filter slots are taken by {log_subscriptions.held_by(found)}; its "
                "fatal lines wake nothing (the alarms, rechecks and sweeper decide, minutes later)"
            )
            yield Check(
                check, Status.WARN, detail, f"free a slot ({SUBSCRIPTION_DOCS}), then stallwatch doctor --subscribe"
            )
        else:
            yield Check(check, Status.WARN, "not subscribed, though a slot is free", "stallwatch doctor --subscribe")


def run_checks(
    deployment: ops.Deployment,
    *,
    send_alert: bool = False,
    subscribe: bool = False,
    slack_api_url: str = SLACK_API_URL,
    clock: Callable[[], float] = time.time,
) -> list[Check]:
    """Every check of a deployed stack, in order (and the test alert, and the subscriptions put, when asked)."""
    deployed = Deployed.find(deployment)
    config = deployment.config
    checks = list(check_resources(deployed, config))
    secret_check, secret = read_secret(deployed)
    checks.append(secret_check)
    if secret is not None:
        checks += check_secret_fields(secret, config)
        if slack_mode_of(secret) is not None:
            checks.append(check_slack(secret, slack_api_url))
    identity = deployment.clients.session.client("sts", config=deployment.clients.config).get_caller_identity()
    region = deployment.clients.session.region_name or ""
    checks += check_iam(deployed, config, region, identity["Account"])
    checks.append(check_sweeper(deployed, config, clock()))
    checks += check_health_topic(deployed, config, region, identity["Account"])
    checks += check_agent_power(deployed, config)
    checks += check_slurm(deployed, config)
    checks += check_log_subscriptions(deployed, config, subscribe)
    if send_alert:
        checks.append(send_test_alert(deployed, identity["Arn"]))
    return checks


@ops.reported
def run_doctor(args: argparse.Namespace) -> int:
    if args.local:
        return run_local(args.send_test_alert)
    deployment = ops.Deployment.from_args(args)
    return print_checks(run_checks(deployment, send_alert=args.send_test_alert, subscribe=args.subscribe))


def run_local(send_alert: bool) -> int:
    """The checks against the local demo's deployment on moto (`localrun.deployment`, in a checkout): its process
    prints them; its exit code is the doctor's."""
    checkout = LOCAL_CHECKOUT
    if not (checkout / "localrun" / "deployment.py").is_file():
        raise ops.OpsError(f"--local needs a checkout of Stallwatch with `make setup` done; none at {checkout}")
    command = [sys.executable, "-m", "localrun.deployment", *(["--send-test-alert"] if send_alert else [])]
    return subprocess.run(command, cwd=checkout, check=False).returncode


def print_checks(checks: list[Check]) -> int:
    """One line per check, then the count; the exit code: 1 if any failed."""
    console = Console()
    for check in checks:
        line = Text.assemble((f"{check.status.value:>4}", STYLES[check.status]), f"  {check.name}: {check.detail}")
        if check.fix:
            line.append(f"  → {check.fix}", style="dim")
        console.print(line)
    failed = sum(c.status is Status.FAIL for c in checks)
    console.print(f"{len(checks)} checks, {failed} failed" if failed else f"{len(checks)} checks passed")
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``doctor`` to the ``stallwatch`` CLI."""
    parser = subparsers.add_parser("doctor", help="check a deployed Stallwatch end to end, one line per check")
    parser.add_argument(
        "--send-test-alert",
        action="store_true",
        help="also send a test alert of a fake job through on_alarm to Slack (marked as a test; nothing is stopped)",
    )
    parser.add_argument(
        "--subscribe",
        action="store_true",
        help="put this deployment's fatal-line subscription filter on each log group that lacks it, where one of its "
        "two slots is free (never removing another)",
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="check the local demo's deployment on moto instead (no account; a checkout after make setup): what a "
        "passing doctor looks like",
    )
    ops.deployment_flags(parser)
    parser.set_defaults(handler=run_doctor)
