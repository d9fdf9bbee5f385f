"""The Slack endpoint construct in a small stack: a Function URL Slack can call, least privilege, cdk-nag clean."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest
from aws_cdk import App, Environment, Stack, Validations
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks

from stacks.bundling import lambda_code
from stacks.constants import SLACK_INTERACTIONS_HANDLER
from stacks.permissions import STOP_OPT_IN_CONDITION, WatchdogPermissions
from stacks.platforms import watched
from stacks.platforms.ec2 import STOP_INSTANCES
from stacks.platforms.sagemaker import STOP_TRAINING_JOB
from stacks.slack_endpoint import TABLE_ACTIONS, TABLE_LEADING_KEYS, SlackEndpoint
from stacks.state_store import StateStore
from stallwatch.aws.pending_stops import PENDING_STOP_PK
from stallwatch.aws.platforms.slurm_runner import COMMAND_PK
from stallwatch.aws.press_reports import PRESS_REPORT_PREFIX
from stallwatch.aws.store import job_key
from stallwatch.core.config import CONFIG_ENV, PRESS_MAX_AGE_SECONDS, StallwatchConfig
from stallwatch.core.signals import Platform
from stallwatch.runtime.interactions import REPORT_CLAIM_SECONDS

from .conftest import as_list, iam_statements, logical_id

SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:stallwatch/slack-AbCdEf"
CONFIG = StallwatchConfig.model_validate({"slack": {"allowed_user_ids": ["U0ALLOWED"]}})


def _endpoint_stack(app: App, name: str, env: Environment | None = None) -> tuple[Stack, SlackEndpoint]:
    stack = Stack(app, name, env=env)
    endpoint = SlackEndpoint(
        stack,
        "SlackEndpoint",
        code=lambda_code(bundle_dependencies=False),
        config=CONFIG,
        table=StateStore(stack, "State").table,
        slack_secret=secretsmanager.Secret.from_secret_complete_arn(stack, "SlackSecret", SECRET_ARN),
        job_statements=WatchdogPermissions(stack, CONFIG, watched(stack, CONFIG)).slack_interactions(),
        dead_letter_queue=sqs.Queue(stack, "DeadLetters", enforce_ssl=True),
    )
    return stack, endpoint


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[App, Stack, SlackEndpoint]:
    """An environment-agnostic stack and one pinned to an account and region, synthesized with cdk-nag."""
    app = App(outdir=str(tmp_path_factory.mktemp("cdk.out")))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack, endpoint = _endpoint_stack(app, "SlackEndpointTest")
    _endpoint_stack(app, "SlackEndpointPinned", Environment(account="123456789012", region="eu-west-1"))
    app.synth()  # raises on any unacknowledged cdk-nag finding
    return app, stack, endpoint


@pytest.fixture(scope="module")
def template(synthesized: tuple[App, Stack, SlackEndpoint]) -> Template:
    return Template.from_stack(synthesized[1])


def test_the_function_url_is_public_and_points_at_the_interactions_function(synthesized, template) -> None:
    # Given the synthesized construct
    _, _, endpoint = synthesized
    function_id = logical_id(endpoint.function)

    # Then the URL has no IAM auth (Slack cannot sign SigV4) and invokes the interactions handler
    template.has_resource_properties(
        "AWS::Lambda::Url",
        {"AuthType": "NONE", "InvokeMode": "BUFFERED", "TargetFunctionArn": {"Fn::GetAtt": [function_id, "Arn"]}},
    )
    template.has_resource_properties(
        "AWS::Lambda::Permission",
        {"Action": "lambda:InvokeFunctionUrl", "Principal": "*", "FunctionUrlAuthType": "NONE"},
    )
    template.has_resource_properties(
        "AWS::Lambda::Permission",
        {"Action": "lambda:InvokeFunction", "Principal": "*", "InvokedViaFunctionUrl": True},
    )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": SLACK_INTERACTIONS_HANDLER,
            "Architectures": ["arm64"],
            "TracingConfig": {"Mode": "Active"},
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "TABLE_NAME": Match.any_value(),
                        "SLACK_SECRET_ARN": SECRET_ARN,
                        CONFIG_ENV: CONFIG.model_dump_json(),
                    }
                )
            },
        },
    )


def test_the_table_grant_is_item_level_and_limited_to_job_state_and_request_claims(template) -> None:
    # Then the function may read and write only job items and its own request claims, and never scan or delete
    (table,) = [s for s in iam_statements(template) if any(a.startswith("dynamodb:") for a in as_list(s["Action"]))]
    assert sorted(as_list(table["Action"])) == sorted(TABLE_ACTIONS)
    assert table["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": TABLE_LEADING_KEYS}}
    # And those are the keys the function writes: a job's, a request's claim, a failed press's claim, a stop that
    # answers later and its Slurm command
    keys = [
        job_key(Platform.SAGEMAKER, "j"),
        "event#slack#" + "0" * 32,
        PRESS_REPORT_PREFIX + "0" * 32,
        PENDING_STOP_PK,
        COMMAND_PK + "pc1",
    ]
    assert all(any(fnmatch.fnmatchcase(key, pattern) for pattern in TABLE_LEADING_KEYS) for key in keys)


def test_the_secret_is_read_only_and_stops_keep_the_tag_condition(template) -> None:
    statements = iam_statements(template)
    actions = [a for s in statements for a in as_list(s["Action"])]

    # Then no action is a wildcard, the secret is only read, and a stop needs the opt-in tag
    assert not [a for a in actions if "*" in a]
    (secret,) = [s for s in statements if "secretsmanager:GetSecretValue" in as_list(s["Action"])]
    assert secret["Resource"] == SECRET_ARN
    assert all(a.startswith("secretsmanager:") and ("Get" in a or "Describe" in a) for a in as_list(secret["Action"]))
    stops = [s for s in statements if {STOP_TRAINING_JOB, STOP_INSTANCES} & set(as_list(s["Action"]))]
    assert len(stops) == 2
    assert all(stop["Condition"] == STOP_OPT_IN_CONDITION for stop in stops)


def test_the_function_may_invoke_itself_and_no_other_function(synthesized, template) -> None:
    # Then the only Lambda permission is InvokeFunction on the endpoint's own function (the deferred press)
    function_id = logical_id(synthesized[2].function)
    (invoke,) = [s for s in iam_statements(template) if any(a.startswith("lambda:") for a in as_list(s["Action"]))]
    assert (invoke["Action"], invoke["Resource"]) == ("lambda:InvokeFunction", {"Fn::GetAtt": [function_id, "Arn"]})


def test_the_endpoint_has_reserved_concurrency_so_a_flood_never_starves_the_watchdog(synthesized, template) -> None:
    # Then the function's executions are reserved, and capped, at the configured number
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Handler": SLACK_INTERACTIONS_HANDLER, "ReservedConcurrentExecutions": CONFIG.slack.reserved_concurrency},
    )
    assert CONFIG.slack.reserved_concurrency == 10


def test_a_press_lambda_gives_up_on_goes_to_a_queue_the_function_reads_back(synthesized, template) -> None:
    # Given the deferred press's asynchronous invocation config and the function's event sources
    function_id = logical_id(synthesized[2].function)
    queue_id = logical_id(synthesized[2].failed_presses)
    [config] = template.find_resources("AWS::Lambda::EventInvokeConfig").values()
    [mapping] = template.find_resources("AWS::Lambda::EventSourceMapping").values()

    # Then a press that fails twice more, or waits past its age, goes to the failed-press queue
    assert config["Properties"] == {
        "FunctionName": {"Ref": function_id},
        "Qualifier": "$LATEST",
        "MaximumRetryAttempts": 2,
        "MaximumEventAgeInSeconds": PRESS_MAX_AGE_SECONDS,
        "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": [queue_id, "Arn"]}}},
    }
    # And the function reads that queue back, reporting the records it could not post as batch item failures
    assert mapping["Properties"]["EventSourceArn"] == {"Fn::GetAtt": [queue_id, "Arn"]}
    assert mapping["Properties"]["FunctionName"] == {"Ref": function_id}
    assert mapping["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["Properties"]["ScalingConfig"] == {"MaximumConcurrency": 2}
    # And the queue is encrypted, SSL-only, and moves what it cannot deliver to the dead-letter queue
    queue = template.find_resources("AWS::SQS::Queue")[queue_id]["Properties"]
    assert queue["SqsManagedSseEnabled"] is True
    assert queue["RedrivePolicy"]["maxReceiveCount"] == 5
    assert queue["VisibilityTimeout"] >= 6 * 30
    # And a failed press's claim on its post back outlives the function, and runs out before the queue delivers again
    timeout = template.find_resources("AWS::Lambda::Function")[function_id]["Properties"]["Timeout"]
    assert timeout < REPORT_CLAIM_SECONDS < queue["VisibilityTimeout"]
    # And the function may send to it and consume it, and nothing else of SQS
    sqs_actions = {a for s in iam_statements(template) for a in as_list(s["Action"]) if a.startswith("sqs:")}
    assert sqs_actions == {
        "sqs:SendMessage",
        "sqs:GetQueueAttributes",
        "sqs:GetQueueUrl",
        "sqs:ReceiveMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessage",
    }


def test_cdk_nag_is_clean_and_every_acknowledgement_has_a_reason(synthesized) -> None:
    # Given the validation report of the synth (an agnostic and a pinned stack)
    app, _, _ = synthesized
    report = json.loads((Path(app.outdir) / "validation-report.json").read_text())
    (aws_solutions,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]

    # Then nothing is unacknowledged, and each acknowledged finding says why
    assert aws_solutions["conclusion"] == "success"
    assert aws_solutions["violations"] == []
    for finding in aws_solutions["suppressedViolations"]:
        assert len(finding["reason"]) > 40, finding["ruleName"]
