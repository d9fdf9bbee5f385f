"""`stallwatch doctor` against the demo's deployment on moto: the stack's real template (its roles, policies,
functions, rules and table) deployed in moto, the demo's Slack (a receiver on 127.0.0.1), its functions invoked in
this process. IAM's answers come from `localrun.moto_iam_simulate`, which evaluates the roles' own policies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import moto  # imported before any boto3 client is created
import pytest

from localrun import moto_iam_simulate, moto_lambda_invoke, moto_sagemaker
from localrun.moto_world import EXAMPLE_AMI, scheduled_event
from localrun.resources import create_resources
from localrun.slack_receiver import SlackReceiver
from localrun.stack_on_moto import deploy_on_moto
from stallwatch.offline import cli, doctor
from stallwatch.offline.ops import Deployment
from tests.fixtures.moto_runtime import aws_env  # noqa: F401 - the AWS environment moto needs, for every test
from tests.fixtures.request_limits import recording
from tests.fixtures.templates import synthesized

STACK = "stallwatch"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"

moto_sagemaker.install()
moto_iam_simulate.install()
moto_lambda_invoke.install()


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The default deployment's template, synthesized as `cdk synth` does (offline)."""
    return synthesized(tmp_path_factory, "default")


@pytest.fixture
def slack() -> Iterator[SlackReceiver]:
    with SlackReceiver() as receiver:
        yield receiver


@pytest.fixture
def deployed(template: dict[str, Any], slack: SlackReceiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The demo's deployment: its table and webhook secret, and the stack around them, with one sweep run."""
    monkeypatch.setenv("COLUMNS", "200")  # the report's lines unwrapped
    with moto.mock_aws():
        resources = create_resources(
            boto3.client("dynamodb"), boto3.client("secretsmanager"), boto3.client("scheduler"), slack.url
        )
        secrets = boto3.client("secretsmanager")
        secrets.put_secret_value(
            SecretId=resources.secret_arn,
            SecretString=json.dumps({"webhook_url": slack.url, "signing_secret": SIGNING_SECRET}),
        )
        deploy_on_moto(template, STACK, resources.secret_arn)
        _invoke("handlers.sweeper.handler", scheduled_event())
        yield resources


def _function(handler: str) -> dict[str, Any]:
    functions = boto3.client("lambda").list_functions()["Functions"]
    return next(f for f in functions if f["Handler"] == handler)


def _invoke(handler: str, event: dict[str, Any]) -> dict[str, Any]:
    answer = boto3.client("lambda").invoke(FunctionName=_function(handler)["FunctionName"], Payload=json.dumps(event))
    return json.loads(answer["Payload"].read())


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_doctor_passes_on_the_demos_deployment_and_its_test_alert_reaches_slack_stopping_nothing(
    deployed: Any, slack: SlackReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    # When the doctor checks the deployment and sends a test alert
    with recording() as requests:
        code = cli.main(["doctor", "--stack", STACK, "--send-test-alert"])
    lines = _lines(capsys)

    # Then every check passes, one line each (a warning for the empty allow-list of the demo's config)
    assert code == 0, "\n".join(lines)
    assert lines[-1].endswith("checks passed")
    assert not [line for line in lines if line.lstrip().startswith("FAIL")]
    for name in ("function on_alarm", "sweeper schedule", "table", "Slack mode", "Slack answers", "sweeper runs"):
        assert any(f"ok  {name}:" in line for line in lines), name
    assert any("ok  IAM on_alarm sagemaker:StopTrainingJob (no tag): implicitDeny" in line for line in lines)
    assert any(
        "ok  IAM on_alarm sagemaker:StopTrainingJob (stallwatch:mode=enforce): allowed" in line for line in lines
    )
    assert any("ok  IAM sweeper sagemaker:CreateTrainingJob (no tag): implicitDeny" in line for line in lines)
    assert any("warn  Slack allow-list: empty" in line for line in lines)
    assert any("ok  health topic policy: CloudWatch may publish its 1 health alarms" in line for line in lines)
    assert any("ok  health topic key: CloudWatch may encrypt with" in line for line in lines)
    assert any("warn  health topic subscribers: none confirmed" in line for line in lines)
    # And a deployment that does not watch Slurm (the default, until a cluster is set up) shows nothing of it
    assert [line for line in lines if "slurm" in line.lower()] == []
    # And the test alert went through on_alarm to Slack, marked as a test; the webhook probe posted nothing
    [probe, alert] = slack.posts
    assert probe == {}
    assert alert["text"].startswith("[TEST] ")
    assert ":test_tube: *TEST*" in alert["blocks"][0]["text"]["text"]
    assert not [b for b in alert["blocks"] if b["type"] == "actions"]  # no button to press
    # And nothing was stopped, and nothing was written to the table
    assert not [
        r
        for r in requests
        if r.operation.startswith("Stop") or r.operation in ("PutItem", "UpdateItem", "TransactWriteItems")
    ]
    assert boto3.client("dynamodb").scan(TableName=deployed.table_name)["Items"] == []


def test_a_stop_that_iam_no_longer_ties_to_the_tag_fails_the_doctor(
    deployed: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given on_alarm's role whose stop statement lost its tag condition (an edit by hand in the console)
    iam = boto3.client("iam")
    role = _function("handlers.on_alarm.handler")["Role"].rsplit("/", 1)[-1]
    [name] = iam.list_role_policies(RoleName=role)["PolicyNames"]
    document = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
    for statement in document["Statement"]:
        if statement.get("Sid") == "StopTrainingJobs":
            statement.pop("Condition")
    iam.put_role_policy(RoleName=role, PolicyName=name, PolicyDocument=json.dumps(document))

    # When the doctor runs, Then it fails, naming the check and what to do
    assert cli.main(["doctor", "--stack", STACK]) == 1
    lines = _lines(capsys)
    [line] = [line for line in lines if "IAM on_alarm sagemaker:StopTrainingJob (no tag)" in line]
    assert line.lstrip().startswith("FAIL")
    assert "allowed, should be denied" in line
    assert "→ deploy the stack again" in line


@pytest.mark.parametrize(
    ("secret", "failing"),
    [
        ({}, "Slack mode"),
        ({"webhook_url": "http://127.0.0.1:9/services/T/B/gone"}, "Slack answers"),
        ({"bot_token": "xoxb-1", "channel": "C0123"}, "Slack signing secret"),
    ],
    ids=["empty", "webhook-unreachable", "no-signing-secret"],
)
def test_a_slack_secret_that_cannot_work_fails_the_doctor(
    deployed: Any, capsys: pytest.CaptureFixture[str], secret: dict[str, str], failing: str
) -> None:
    boto3.client("secretsmanager").put_secret_value(SecretId=deployed.secret_arn, SecretString=json.dumps(secret))
    checks = doctor.run_checks(Deployment(stack=STACK), slack_api_url="http://127.0.0.1:9/api/")
    [check] = [c for c in checks if c.name == failing]
    assert check.status is doctor.Status.FAIL
    assert check.fix


def test_a_sweeper_that_has_not_run_fails_the_doctor(deployed: Any) -> None:
    # Given a clock two hours on: the sweep the fixture ran is long past
    checks = doctor.run_checks(Deployment(stack=STACK), clock=lambda: __import__("time").time() + 7200)
    [sweeper] = [c for c in checks if c.name == "sweeper runs"]
    assert (sweeper.status, sweeper.detail) == (doctor.Status.FAIL, "no run in the last 15 min")


def _health_topic() -> str:
    [topic] = [t["TopicArn"] for t in boto3.client("sns").list_topics()["Topics"]]
    return topic


def _check(name: str) -> doctor.Check:
    [check] = [c for c in doctor.run_checks(Deployment(stack=STACK)) if c.name == name]
    return check


def _cloudwatch_may_publish(topic: str, **conditions: dict[str, str]) -> dict[str, Any]:
    allow = {
        "Effect": "Allow",
        "Principal": {"Service": "cloudwatch.amazonaws.com"},
        "Action": "sns:Publish",
        "Resource": topic,
    }
    return {"Version": "2012-10-17", "Statement": [{**allow, "Condition": conditions} if conditions else allow]}


def test_the_stacks_topic_policy_lets_the_health_alarms_publish_and_a_topic_without_it_fails_the_doctor(
    deployed: Any,
) -> None:
    # Given the deployed health topic, whose policy the stack wrote
    topic = _health_topic()
    sns = boto3.client("sns")
    assert _check("health topic policy").status is doctor.Status.OK

    # When the policy is SNS's default one, or only the SSL deny (what enforce_ssl alone writes)
    ssl_only = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sns:Publish",
                "Resource": topic,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    }
    sns.set_topic_attributes(TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(ssl_only))

    # Then the doctor fails the check, saying what is lost and how to mend it
    check = _check("health topic policy")
    assert check.status is doctor.Status.FAIL
    assert "CloudWatch may not publish 1 of 1 health alarms" in check.detail
    assert check.fix.startswith("deploy the stack again")


def test_a_topic_any_accounts_alarms_may_publish_to_is_a_warning(deployed: Any) -> None:
    # Given a hand-edited policy that lets CloudWatch publish without aws:SourceAccount or aws:SourceArn
    topic = _health_topic()
    policy = _cloudwatch_may_publish(topic)
    boto3.client("sns").set_topic_attributes(TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(policy))

    # Then the health alarms can publish, but so can another account's: a warning, with the fix
    check = _check("health topic policy")
    assert (check.status, check.detail) == (doctor.Status.WARN, "another account's alarms may publish to it too")
    assert "aws:SourceAccount" in check.fix


def test_a_topic_policy_for_other_alarms_only_fails_the_doctor(deployed: Any) -> None:
    # Given a policy whose CloudWatch allow names another deployment's alarms
    topic = _health_topic()
    other = "arn:aws:cloudwatch:us-east-1:123456789012:alarm:team-b-health-*"
    policy = _cloudwatch_may_publish(
        topic, StringEquals={"aws:SourceAccount": "123456789012"}, ArnLike={"aws:SourceArn": other}
    )
    boto3.client("sns").set_topic_attributes(TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(policy))

    # Then this deployment's health alarms may not publish: the check fails
    assert _check("health topic policy").status is doctor.Status.FAIL


def test_a_key_that_does_not_let_cloudwatch_encrypt_fails_the_doctor(deployed: Any) -> None:
    # Given the topic's key, its CloudWatch grant removed (the account's root statement kept)
    kms = boto3.client("kms")
    key = boto3.client("sns").get_topic_attributes(TopicArn=_health_topic())["Attributes"]["KmsMasterKeyId"]
    policy = json.loads(kms.get_key_policy(KeyId=key, PolicyName="default")["Policy"])
    policy["Statement"] = [s for s in policy["Statement"] if "Service" not in s["Principal"]]
    kms.put_key_policy(KeyId=key, PolicyName="default", Policy=json.dumps(policy))

    # Then the key check fails: nothing would be delivered
    check = _check("health topic key")
    assert check.status is doctor.Status.FAIL
    assert "no alarm is delivered" in check.detail


def test_the_iam_simulation_extension_evaluates_conditions_as_iam_does() -> None:
    # Given Stallwatch's stop statement (the tag condition, any case) and an explicit deny beside an allow
    stop = {
        "Effect": "Allow",
        "Action": "sagemaker:StopTrainingJob",
        "Resource": "arn:aws:sagemaker:us-east-1:123456789012:training-job/*",
        "Condition": {"StringEqualsIgnoreCase": {"aws:ResourceTag/stallwatch:mode": "enforce"}},
    }
    job = "arn:aws:sagemaker:us-east-1:123456789012:training-job/j"
    evaluate = moto_iam_simulate.evaluate
    assert (
        evaluate(
            [{"Statement": [stop]}], "sagemaker:StopTrainingJob", job, {"aws:resourcetag/stallwatch:mode": ["ENFORCE"]}
        )
        == "allowed"
    )
    assert evaluate([{"Statement": [stop]}], "sagemaker:StopTrainingJob", job, {}) == "implicitDeny"
    assert (
        evaluate(
            [{"Statement": [stop]}], "sagemaker:StopTrainingJob", job, {"aws:resourcetag/stallwatch:mode": ["notify"]}
        )
        == "implicitDeny"
    )
    assert evaluate([{"Statement": [stop]}], "sagemaker:DeleteTrainingJob", job, {}) == "implicitDeny"
    deny = {"Effect": "Deny", "Action": "sagemaker:*", "Resource": "*"}
    assert (
        evaluate(
            [{"Statement": [stop, deny]}],
            "sagemaker:StopTrainingJob",
            job,
            {"aws:resourcetag/stallwatch:mode": ["enforce"]},
        )
        == "explicitDeny"
    )
    # Null: "false" holds when the key is present
    null = {
        "Effect": "Allow",
        "Action": "ec2:StartInstances",
        "Resource": "*",
        "Condition": {"Null": {"aws:ResourceTag/stallwatch:resume": "false"}},
    }
    assert (
        evaluate(
            [{"Statement": [null]}],
            "ec2:StartInstances",
            "arn:aws:ec2:us-east-1:1:instance/i-1",
            {"aws:resourcetag/stallwatch:resume": ["2"]},
        )
        == "allowed"
    )
    assert (
        evaluate([{"Statement": [null]}], "ec2:StartInstances", "arn:aws:ec2:us-east-1:1:instance/i-1", {})
        == "implicitDeny"
    )
    # An operator it does not implement is never answered
    other = {
        "Effect": "Allow",
        "Action": "*",
        "Resource": "*",
        "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020-01-01"}},
    }
    with pytest.raises(moto_iam_simulate.UnsupportedConditionError):
        evaluate([{"Statement": [other]}], "s3:GetObject", "*", {})


def _subscription_checks(**kwargs: Any) -> dict[str, doctor.Check]:
    checks = doctor.run_checks(Deployment(stack=STACK), **kwargs)
    return {c.name.removeprefix("fatal lines of "): c for c in checks if c.name.startswith("fatal lines of ")}


def test_the_doctor_finds_each_groups_fatal_line_filter_to_on_log_line(deployed: Any) -> None:
    checks = _subscription_checks()
    assert set(checks) == {"/aws/sagemaker/TrainingJobs", "/stallwatch/ec2"}  # Slurm's where it is watched
    on_log_line = _function("handlers.on_log_line.handler")["FunctionName"]
    for check in checks.values():
        assert (check.status, check.detail) == (doctor.Status.OK, f"stallwatch-fatal-lines → {on_log_line}")


def test_both_slots_taken_by_other_filters_is_named_and_subscribe_takes_a_slot_once_one_is_free(
    deployed: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given SageMaker's group whose two slots other tools took (our filter was never put: no slot was free)
    logs, group = boto3.client("logs"), "/aws/sagemaker/TrainingJobs"
    theirs = _function("handlers.on_log_line.handler")["FunctionArn"]  # one CloudWatch Logs may invoke for the group
    logs.delete_subscription_filter(logGroupName=group, filterName="stallwatch-fatal-lines")
    for name in ("splunk-forwarder", "datadog-forwarder"):
        logs.put_subscription_filter(logGroupName=group, filterName=name, filterPattern="", destinationArn=theirs)
    # When the doctor checks, Then it warns, names them, and says what to do (the run still passes)
    check = _subscription_checks()[group]
    assert check.status is doctor.Status.WARN
    assert "splunk-forwarder" in check.detail
    assert "datadog-forwarder" in check.detail
    assert "docs/deploy.md" in check.fix
    assert "--subscribe" in check.fix
    # And --subscribe changes nothing while both are taken
    assert _subscription_checks(subscribe=True)[group].status is doctor.Status.WARN
    assert len(logs.describe_subscription_filters(logGroupName=group)["subscriptionFilters"]) == 2
    # When one is freed and the doctor runs with --subscribe, Then ours takes it, beside the other tool's
    logs.delete_subscription_filter(logGroupName=group, filterName="datadog-forwarder")
    assert cli.main(["doctor", "--stack", STACK, "--subscribe"]) == 0
    names = {f["filterName"] for f in logs.describe_subscription_filters(logGroupName=group)["subscriptionFilters"]}
    assert names == {"splunk-forwarder", "stallwatch-fatal-lines"}
    assert _subscription_checks()[group].status is doctor.Status.OK


def test_an_ec2_job_whose_agent_publishes_no_gpu_power_is_a_warning_that_says_what_power_would_give(
    deployed: Any,
) -> None:
    # Given a running 2-node EC2 job, the CloudWatch agent of only one of its nodes publishing GPU power
    ec2 = boto3.client("ec2")
    launched = ec2.run_instances(
        ImageId=EXAMPLE_AMI,
        InstanceType="p4d.24xlarge",
        MinCount=2,
        MaxCount=2,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "stallwatch:job", "Value": "train-a"}]}],
    )
    first, second = sorted(i["InstanceId"] for i in launched["Instances"])

    def power(instance: str) -> None:
        boto3.client("cloudwatch").put_metric_data(
            Namespace="CWAgent",
            MetricData=[
                {
                    "MetricName": "nvidia_smi_power_draw",
                    "Dimensions": [{"Name": "InstanceId", "Value": instance}],
                    "Value": 310.0,
                }
            ],
        )

    power(first)

    # When the doctor runs, Then the job gets a warning naming the node without power, and why power matters
    with recording() as requests:
        check = _check("EC2 GPU power train-a")
    assert [v for r in requests for v in r.violations()] == []
    assert (check.status, check.detail) == (
        doctor.Status.WARN,
        f"1 of 2 instances publish no nvidia_smi_power_draw ({second})",
    )
    assert "power_draw" in check.fix
    assert "decides a silent hang sooner" in check.fix

    # And once every node publishes it, the check passes
    power(second)
    assert _check("EC2 GPU power train-a").status is doctor.Status.OK


def test_a_trainium_instance_is_not_asked_for_gpu_power_and_a_gpu_instance_beside_it_is(deployed: Any) -> None:
    # Given a running EC2 job of two Trainium instances (no NVIDIA GPU, no nvidia_smi_power_draw to publish), and a
    # job of a Trainium and a GPU instance, neither publishing GPU power
    ec2 = boto3.client("ec2")

    def launch(job: str, instance_type: str) -> str:
        tags = [{"Key": "stallwatch:job", "Value": job}]
        [instance] = ec2.run_instances(
            ImageId=EXAMPLE_AMI,
            InstanceType=instance_type,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"]
        return str(instance["InstanceId"])

    launch("neuron-a", "trn1.32xlarge")
    launch("neuron-a", "trn1.32xlarge")
    launch("mixed-b", "trn1.32xlarge")
    gpu = launch("mixed-b", "p4d.24xlarge")

    # When the doctor runs, Then the Trainium job passes, and the mixed job is warned of its GPU instance alone
    neuron = _check("EC2 GPU power neuron-a")
    assert (neuron.status, neuron.detail) == (doctor.Status.OK, "no GPU instance: Neuron power is the training agent's")
    mixed = _check("EC2 GPU power mixed-b")
    assert (mixed.status, mixed.detail) == (
        doctor.Status.WARN,
        f"1 of 1 instances publish no nvidia_smi_power_draw ({gpu})",
    )
