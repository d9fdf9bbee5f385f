"""``stallwatch doctor``: is a deployed Stallwatch working? One line per check, with what to do about a failure.

    stallwatch doctor                      # the default deployment (stack "stallwatch"), with your AWS credentials
    stallwatch doctor --stack team-b --send-test-alert   # and a test message through on_alarm to Slack
    stallwatch doctor --local              # the local demo's deployment on moto: what passing looks like

The checks, in order: the stack's functions, the sweeper's schedule and the table exist and are ready; the Slack
secret holds what its mode needs, and Slack answers (`doctor_slack`); IAM allows each watched platform's stops and
resumes only under their tags (``iam:SimulatePrincipalPolicy`` of each function's role, with and without the tag: the
platform's `iam_probes`); the sweeper ran recently and without errors; the health topic lets this account's health
alarms (and no other's) publish, its key lets them encrypt (`iam_evaluator`), and someone has confirmed a
subscription; each watched platform's own checks (its adapter's `doctor`: its events' rule; EC2, each running job's
GPU power; Slurm, each cluster's runner answering a ping through the table, its log group and job events); each
training log group the deployment subscribes holds its fatal-line filter to on_log_line (or why not: the group's two
slots taken by other filters, named). A platform the deployment does not watch shows nothing.
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
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from stallwatch.aws import log_subscriptions
from stallwatch.core.config import FATAL_LINES_FILTER, StallwatchConfig, slack_mode_of
from stallwatch.core.doctor_checks import Check, StackFound, Status
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.platforms.interface import PlatformAdapter
from stallwatch.offline import ops
from stallwatch.offline.doctor_slack import (
    SLACK_API_URL,
    SLACK_SECRET_ENV,
    check_secret_fields,
    check_slack,
    read_secret,
)
from stallwatch.offline.iam_evaluator import serves

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
SWEEPS_LOOKED_AT = 3  # the sweeper's last run is recent: within this many sweeper periods
TEST_ALERT_KEY = "stallwatch_test_alert"
TOPIC_RESOURCE_TYPE = "AWS::SNS::Topic"
# What CloudWatch needs to notify an encrypted topic: publish to it, and encrypt with its key.
TOPIC_ACTIONS = ("sns:Publish",)
KEY_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")
PROBE_ALARM = "probe"  # a health alarm's name after the prefix, where the stack's alarms cannot be listed
OTHER_ACCOUNT = "000000000000"  # an account the grants must not serve (the confused deputy)
# The checkout the CLI runs from (an editable install of lambdas/): where --local finds the demo's deployment.
LOCAL_CHECKOUT = Path(__file__).resolve().parents[3]


STYLES = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


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
        return self.found().env(variable)

    def found(self, region: str = "", account: str = "") -> StackFound:
        """What was found, as the platforms' adapters read it (`PlatformAdapter.doctor`)."""
        return StackFound(self.deployment.stack, self.functions, self.rules, region, account)


def watched_adapters(deployed: Deployed, config: StallwatchConfig) -> list[PlatformAdapter]:
    """The adapters of the platforms the deployment watches, over its clients and table, in registry order."""
    from stallwatch.aws.platforms import adapter  # imported here: only the platforms' checks read their jobs

    store = deployed.deployment.store()
    clients = deployed.deployment.clients
    return [adapter(p, clients, config, store) for p in DESCRIPTIONS if config.watches(p)]


def check_platforms(deployed: Deployed, sources: list[PlatformAdapter], region: str, account: str) -> Iterator[Check]:
    """Each watched platform's own checks (`PlatformAdapter.doctor`): its rule, its resources, its hosts' metrics."""
    found = deployed.found(region, account)
    for source in sources:
        yield from source.doctor(found)


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
    """The functions (active), the sweeper's schedule (enabled), the table (each watched platform checks its own rule:
    `check_platforms`)."""
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
    schedule = next((r for r in deployed.rules if r.get("ScheduleExpression")), None)
    if schedule is None:
        yield Check("sweeper schedule", Status.FAIL, "not in the stack", redeploy)
    elif schedule.get("State") != "ENABLED":
        fix = f"aws events enable-rule --name {schedule['Name']}"
        yield Check("sweeper schedule", Status.FAIL, f"{schedule['Name']} is {schedule.get('State')}", fix)
    else:
        yield Check("sweeper schedule", Status.OK, f"{schedule['Name']} {schedule['ScheduleExpression']}")
    status = deployed.deployment.clients.dynamodb.describe_table(TableName=deployed.table)["Table"]["TableStatus"]
    if status == "ACTIVE":
        yield Check("table", Status.OK, f"{deployed.table} {status}")
    else:
        yield Check("table", Status.FAIL, f"{deployed.table} {status}", redeploy)


def check_iam(deployed: Deployed, sources: list[PlatformAdapter], region: str, account: str) -> Iterator[Check]:
    """Each watched platform's probes (`PlatformAdapter.iam_probes`) simulated against the function's role: allowed
    where it should be, denied elsewhere."""
    iam = deployed.deployment.clients.session.client("iam", config=deployed.deployment.clients.config)
    for probe in (p for source in sources for p in source.iam_probes(region, account)):
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
    refused = [a for a in alarm_arns if not serves(policy, TOPIC_ACTIONS, topic, account, a)]
    if refused:
        detail = f"CloudWatch may not publish {len(refused)} of {len(alarm_arns)} health alarms ({refused[0]})"
        yield Check("health topic policy", Status.FAIL, f"{detail}: nobody hears of a failed stop", redeploy)
    elif serves(policy, TOPIC_ACTIONS, topic, OTHER_ACCOUNT, foreign):
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
    if all(serves(policy, KEY_ACTIONS, "*", account, arn) for arn in alarm_arns):
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
    for group in config.subscribed_log_groups().values():
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
    secret_check, secret = read_secret(deployment.clients.secretsmanager, deployed.env(SLACK_SECRET_ENV))
    checks.append(secret_check)
    if secret is not None:
        checks += check_secret_fields(secret, config)
        if slack_mode_of(secret) is not None:
            checks.append(check_slack(secret, slack_api_url))
    identity = deployment.clients.session.client("sts", config=deployment.clients.config).get_caller_identity()
    region = deployment.clients.session.region_name or ""
    sources = watched_adapters(deployed, config)
    checks += check_iam(deployed, sources, region, identity["Account"])
    checks.append(check_sweeper(deployed, config, clock()))
    checks += check_health_topic(deployed, config, region, identity["Account"])
    checks += check_platforms(deployed, sources, region, identity["Account"])
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
