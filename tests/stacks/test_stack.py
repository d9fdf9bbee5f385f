"""The default stack's resources, read from the synthesized template."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match, Template

from stacks.constants import ALARM_ACTION_PRINCIPAL, LAMBDA_MEMORY_MB
from stacks.dashboards import JOB_PLACEHOLDER
from stacks.stallwatch_stack import StallwatchStack
from stallwatch.aws.fleet_runs import emf_lines
from stallwatch.core.config import CONFIG_ENV, JOB_DASHBOARD_URL_ENV, StallwatchConfig
from stallwatch.core.contract import (
    CONTROL_PLANE_NAMESPACE,
    JOB_METRICS,
    OPERATOR_ACTIONS_FAILED,
    RECHECK_SCHEDULE_FAILURES,
    RENAMED_METRICS,
    RESUME_FAILURES,
    RUN_GPU_HOURS,
    SERVICE,
    SLACK_FAILURES,
    STOP_FAILURES,
)
from stallwatch.core.fleet import RunRecord
from stallwatch.core.goodput import Category, Total

from .conftest import logical_id


def test_the_table_has_the_runtime_keys_ttl_pitr_and_encryption(template: Template) -> None:
    template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "Properties": {
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
                "SSESpecification": {"SSEEnabled": True},
                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                "BillingMode": "PAY_PER_REQUEST",
                "DeletionProtectionEnabled": True,
            },
            "DeletionPolicy": "Retain",
        },
    )


def test_six_arm64_python_functions_share_one_asset_and_the_environment(
    template: Template, stack: StallwatchStack
) -> None:
    functions = template.find_resources("AWS::Lambda::Function")
    assert {f["Properties"]["Handler"] for f in functions.values()} == {
        "handlers.on_job_state.handler",
        "handlers.on_alarm.handler",
        "handlers.sweeper.handler",
        "handlers.on_log_line.handler",
        "handlers.slack_interactions.handler",
        "handlers.on_health_event.handler",  # AWS Health's scheduled events (tests/stacks/test_health_events.py)
        "handlers.log_subscription.handler",  # the subscription's custom resource (tests/stacks/test_log_subscriptions)
    }
    assert len({json.dumps(f["Properties"]["Code"]) for f in functions.values()}) == 1
    on_alarm = logical_id(stack.watchdog.on_alarm)
    subscriber = logical_id(stack.platforms["sagemaker"].subscriber)  # type: ignore[attr-defined]
    for name, function in functions.items():
        if name == subscriber:
            continue
        properties = function["Properties"]
        assert properties["Runtime"] == "python3.12"
        assert properties["Architectures"] == ["arm64"]
        assert properties["MemorySize"] == LAMBDA_MEMORY_MB
        assert properties["TracingConfig"] == {"Mode": "Active"}
        # Asynchronous invocations (EventBridge, alarm actions) keep their failures; the Function URL is synchronous.
        assert ("DeadLetterConfig" in properties) == (properties["Handler"] != "handlers.slack_interactions.handler")
        env = properties["Environment"]["Variables"]
        assert StallwatchConfig.model_validate_json(env[CONFIG_ENV]) == stack.config
        assert env["POWERTOOLS_SERVICE_NAME"] == "stallwatch"
        assert set(env) >= {"TABLE_NAME", "SLACK_SECRET_ARN"}
    for function in (stack.watchdog.on_job_state, stack.watchdog.sweeper, stack.watchdog.on_log_line):
        env = functions[logical_id(function)]["Properties"]["Environment"]["Variables"]
        assert env["ALARM_ACTION_ARN"] == {"Fn::GetAtt": [on_alarm, "Arn"]}


def test_slack_buttons_reach_the_interactions_function_through_a_function_url(
    template: Template, stack: StallwatchStack
) -> None:
    target = {"Fn::GetAtt": [logical_id(stack.slack_endpoint.function), "Arn"]}
    template.has_resource_properties("AWS::Lambda::Url", {"AuthType": "NONE", "TargetFunctionArn": target})
    template.has_output("SlackInteractivityUrl", {})


def test_state_changes_and_the_schedule_invoke_the_functions(template: Template, stack: StallwatchStack) -> None:
    on_job_state = {"Fn::GetAtt": [logical_id(stack.watchdog.on_job_state), "Arn"]}
    for source, detail_type in [
        ("aws.sagemaker", "SageMaker Training Job State Change"),
        ("aws.ec2", "EC2 Instance State-change Notification"),
    ]:
        template.has_resource_properties(
            "AWS::Events::Rule",
            {
                "EventPattern": {"source": [source], "detail-type": [detail_type]},
                "Targets": [Match.object_like({"Arn": on_job_state, "DeadLetterConfig": Match.any_value()})],
            },
        )
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": f"rate({stack.config.sweeper_minutes} minutes)",
            "Targets": [Match.object_like({"Arn": {"Fn::GetAtt": [logical_id(stack.watchdog.sweeper), "Arn"]}})],
        },
    )


def test_only_this_deployments_alarms_may_invoke_on_alarm(template: Template, stack: StallwatchStack) -> None:
    template.has_resource_properties(
        "AWS::Lambda::Permission",
        {
            "Principal": ALARM_ACTION_PRINCIPAL,
            "FunctionName": {"Fn::GetAtt": [logical_id(stack.watchdog.on_alarm), "Arn"]},
            "SourceAccount": {"Ref": "AWS::AccountId"},
            "SourceArn": {
                "Fn::Join": [
                    "",
                    Match.array_with([Match.string_like_regexp(f":alarm:{stack.config.alarm_prefix}\\*$")]),
                ]
            },
        },
    )


def test_the_dead_letter_queue_is_encrypted_ssl_only_and_alarmed(template: Template, stack: StallwatchStack) -> None:
    queue = logical_id(stack.watchdog.dead_letter_queue)
    template.has_resource_properties("AWS::SQS::Queue", {"SqsManagedSseEnabled": True})
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ApproximateNumberOfMessagesVisible",
            "Dimensions": [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}],
            "AlarmActions": [{"Ref": logical_id(stack.notifications.topic)}],
        },
    )


def test_every_function_has_error_and_throttle_alarms_to_the_encrypted_topic(
    template: Template, stack: StallwatchStack
) -> None:
    topic = {"Ref": logical_id(stack.notifications.topic)}
    for function in stack.watchdog.functions:
        for metric in ("Errors", "Throttles"):
            template.has_resource_properties(
                "AWS::CloudWatch::Alarm",
                {
                    "MetricName": metric,
                    "Namespace": "AWS/Lambda",
                    "Dimensions": [{"Name": "FunctionName", "Value": {"Ref": logical_id(function)}}],
                    "AlarmActions": [topic],
                },
            )
    template.has_resource_properties(
        "AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [logical_id(stack.notifications.topic_key), "Arn"]}}
    )
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def _resolved_arn(arn: dict) -> str:
    """A synthesized `Fn::Join` ARN as text, its pseudo parameters as `<Name>`."""
    return "".join(part if isinstance(part, str) else f"<{part['Ref']}>" for part in arn["Fn::Join"][1])


def test_cloudwatch_may_publish_the_health_alarms_to_the_topic_and_use_its_key_for_them_alone(
    template: Template, stack: StallwatchStack
) -> None:
    # Given the health topic's policy (it replaces SNS's default one) and its key's policy
    topic = {"Ref": logical_id(stack.notifications.topic)}
    [policy] = template.find_resources("AWS::SNS::TopicPolicy").values()
    assert policy["Properties"]["Topics"] == [topic]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    [key] = template.find_resources("AWS::KMS::Key").values()
    key_statements = key["Properties"]["KeyPolicy"]["Statement"]
    alarms = f"arn:<AWS::Partition>:cloudwatch:<AWS::Region>:<AWS::AccountId>:alarm:{stack.config.alarm_prefix}health-*"

    # Then the SSL deny stays, and CloudWatch may publish, for this account's health alarms only
    assert {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}.items() <= statements[0].items()
    [allow] = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert (allow["Action"], allow["Resource"]) == ("sns:Publish", topic)
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert _resolved_arn(allow["Condition"]["ArnLike"]["aws:SourceArn"]) == alarms
    # And the key lets CloudWatch encrypt for the same alarms only
    [grant] = [s for s in key_statements if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert grant["Action"] == ["kms:Decrypt", "kms:GenerateDataKey*"]
    assert grant["Condition"] == allow["Condition"]
    # And every alarm that notifies the topic is named so that the grants cover it
    notifying = [
        a["Properties"]
        for a in template.find_resources("AWS::CloudWatch::Alarm").values()
        if topic in a["Properties"].get("AlarmActions", [])
    ]
    assert len(notifying) >= 13
    assert all(a["AlarmName"].startswith(f"{stack.config.alarm_prefix}health-") for a in notifying)
    assert len({a["AlarmName"] for a in notifying}) == len(notifying)


def test_failed_stops_slack_posts_resumes_and_rechecks_alarm_to_the_topic(
    template: Template, stack: StallwatchStack
) -> None:
    for metric in (STOP_FAILURES, SLACK_FAILURES, RESUME_FAILURES, RECHECK_SCHEDULE_FAILURES, OPERATOR_ACTIONS_FAILED):
        template.has_resource_properties(
            "AWS::CloudWatch::Alarm",
            {
                "MetricName": metric,
                "Namespace": CONTROL_PLANE_NAMESPACE,
                "Dimensions": [{"Name": "service", "Value": SERVICE}],
                "Statistic": "Sum",
                "AlarmActions": [{"Ref": logical_id(stack.notifications.topic)}],
            },
        )


def test_a_press_record_lambda_could_not_hand_to_its_destination_alarms(template: Template, stack) -> None:
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "DestinationDeliveryFailures",
            "Namespace": "AWS/Lambda",
            "Dimensions": [{"Name": "FunctionName", "Value": {"Ref": logical_id(stack.slack_endpoint.function)}}],
            "Statistic": "Sum",
            "AlarmActions": [{"Ref": logical_id(stack.notifications.topic)}],
        },
    )


def test_an_empty_slack_secret_is_created_without_an_arn_in_config(template: Template) -> None:
    template.has_resource_properties("AWS::SecretsManager::Secret", {"SecretString": "{}"})


def test_the_job_dashboard_picks_the_job_by_a_variable_and_shows_every_panel(
    template: Template, stack: StallwatchStack
) -> None:
    body = json.loads(_dashboard_body(template, logical_id(stack.dashboards.job)))
    [variable] = body["variables"]
    assert (variable["id"], variable["type"], variable["pattern"]) == ("JobName", "pattern", JOB_PLACEHOLDER)
    assert variable["search"] == '{Stallwatch,JobName} MetricName="Step"'
    shown = json.dumps(body["widgets"])
    current = [name for name in JOB_METRICS if name not in RENAMED_METRICS]
    for metric in (*current, "AcceleratorUtilization", "AcceleratorPowerWatts", "AcceleratorPowerPercent", "Heartbeat"):
        assert metric in shown, metric
    assert JOB_PLACEHOLDER in shown
    [goodput] = [w for w in body["widgets"] if w["properties"].get("title", "").startswith("Goodput")]
    expressions = [m[0]["expression"] for m in goodput["properties"]["metrics"] if "expression" in m[0]]
    assert "100 * IF(steps > 0, 1, 0)" in expressions
    assert goodput["properties"]["stacked"] is True


def test_the_fleet_dashboard_shows_every_job_and_the_control_plane(template: Template, stack: StallwatchStack) -> None:
    shown = json.dumps(json.loads(_dashboard_body(template, logical_id(stack.dashboards.fleet)))["widgets"])
    for metric in ("LastStepAge", "TokensPerSecond", "MFU", "AcceleratorUtilization", "LogIdleSeconds", "Invocations"):
        assert metric in shown, metric
    assert CONTROL_PLANE_NAMESPACE in shown


def test_the_fleet_dashboard_sums_the_runs_goodput_by_category_platform_team_and_instance_type(
    template: Template, stack: StallwatchStack
) -> None:
    # Given the metrics a run's end publishes (one EMF line per category, every dimension set)
    totals = {Category.PRODUCTIVE: Total(3600, 8)}
    run = RunRecord("llm", "ec2", "vision", "p5.48xlarge", 0.0, 3600.0, 3600.0, 1, totals)
    [line] = emf_lines(run, "stallwatch", 3600.0)
    published = {tuple(dims) for dims in line["_aws"]["CloudWatchMetrics"][0]["Dimensions"]}
    # When the fleet dashboard is read, Then a bar widget sums each of them over the dashboard's range
    widgets = json.loads(_dashboard_body(template, logical_id(stack.dashboards.fleet)))["widgets"]
    searched = {}
    for widget in widgets:
        for metric in widget.get("properties", {}).get("metrics", []):
            expression = metric[0].get("expression", "") if metric and isinstance(metric[0], dict) else ""
            if RUN_GPU_HOURS in expression:
                schema = expression.split("{", 1)[1].split("}", 1)[0].split(",")[1:]
                searched[tuple(schema)] = widget["properties"]
    assert set(searched) == published
    for properties in searched.values():
        assert (properties["view"], properties["setPeriodToTimeRange"]) == ("bar", True)


def _dashboard_body(template: Template, dashboard: str) -> str:
    """The dashboard JSON with its CloudFormation tokens (region, function names) replaced by placeholders."""
    parts = template.to_json()["Resources"][dashboard]["Properties"]["DashboardBody"]["Fn::Join"][1]
    return "".join(part if isinstance(part, str) else "TOKEN" for part in parts)


def test_every_output_says_what_it_is_for_and_the_dashboards_are_console_links(
    template: Template, stack: StallwatchStack
) -> None:
    outputs = template.find_outputs("*")
    assert set(outputs) >= {"SlackSecretArn", "SlackInteractivityUrl", "HealthTopicArn", "TableName"}
    for name, output in outputs.items():
        assert len(output.get("Description", "")) > 20, name
    hosts = template.to_json()["Mappings"]["ConsoleHosts"]
    assert hosts["aws"] == {"host": "console.aws.amazon.com"}
    assert set(hosts) == {"aws", "aws-cn", "aws-us-gov"}
    for output, dashboard in (("FleetDashboardUrl", stack.dashboards.fleet), ("JobDashboardUrl", stack.dashboards.job)):
        assert outputs[output]["Value"] == {
            "Fn::Join": [
                "",
                [
                    "https://",
                    {"Fn::FindInMap": ["ConsoleHosts", {"Ref": "AWS::Partition"}, "host"]},
                    "/cloudwatch/home?region=",
                    {"Ref": "AWS::Region"},
                    "#dashboards/dashboard/",
                    {"Ref": logical_id(dashboard)},
                ],
            ]
        }


def test_the_functions_that_post_the_run_summary_link_the_job_dashboard(
    template: Template, stack: StallwatchStack
) -> None:
    # Given the synthesized functions and the job dashboard
    functions = template.find_resources("AWS::Lambda::Function")
    dashboard = template.to_json()["Resources"][logical_id(stack.dashboards.job)]["Properties"]["DashboardName"]
    console = [
        "https://",
        {"Fn::FindInMap": ["ConsoleHosts", {"Ref": "AWS::Partition"}, "host"]},
        "/cloudwatch/home?region=",
        {"Ref": "AWS::Region"},
        "#dashboards/dashboard/",
    ]
    # Then on_job_state and the sweeper (which post it) carry the console URL of that very dashboard's name
    for function in (stack.watchdog.on_job_state, stack.watchdog.sweeper):
        url = functions[logical_id(function)]["Properties"]["Environment"]["Variables"][JOB_DASHBOARD_URL_ENV]
        assert _joined(url["Fn::Join"][1]) == _joined([*console, *dashboard["Fn::Join"][1]])
    # And on_alarm, which posts none, does not
    on_alarm = functions[logical_id(stack.watchdog.on_alarm)]["Properties"]["Environment"]["Variables"]
    assert JOB_DASHBOARD_URL_ENV not in on_alarm


def _joined(parts: list) -> list:
    """An Fn::Join's parts with adjacent strings merged, as CDK merges them."""
    merged: list = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    return merged
