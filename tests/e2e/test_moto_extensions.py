"""The moto extensions the tests, the bench and the demo share: requests served one at a time, SEARCH in
GetMetricData, the Logs Insights last-event query, DescribeAlarms' filters and pages, FilterLogEvents' term
patterns, and CloudFormation's topic policies and key policies (anything else still goes to moto's own code)."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime

import boto3
import moto
import pytest
from botocore.exceptions import ClientError
from moto.ec2.models import ec2_backends
from moto.ec2.utils import generic_filter

from localrun import (
    boto_models,
    moto_alarm_filters,
    moto_ec2,
    moto_logs_filter,
    moto_logs_insights,
    moto_metric_search,
    moto_threads,
    moto_topic_policy,
)
from localrun.moto_sagemaker import DEFAULT_ACCOUNT, DEFAULT_REGION
from localrun.resources import create_table
from stallwatch.aws.job_states import JobStates, StoredState
from stallwatch.aws.store import Store
from stallwatch.core.decision import JobState

moto_threads.install()
moto_metric_search.install()
moto_logs_insights.install()
moto_alarm_filters.install()
moto_logs_filter.install()
moto_topic_policy.install()


@pytest.fixture(autouse=True)
def aws(monkeypatch: pytest.MonkeyPatch):
    """moto for every test; the credentials and region are tests/conftest.py's."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        yield


@pytest.mark.slow
def test_concurrent_transactions_on_one_table_all_commit() -> None:
    # Given one table and 8 threads committing 25 decisions each, as the sweeper's workers do
    dynamodb = boto3.client("dynamodb")
    create_table(dynamodb, "t")
    store, errors = JobStates(Store(dynamodb, "t", 1)), []

    def decide(worker: int) -> None:
        try:
            for i in range(25):
                store.commit(f"job#sagemaker#{worker}-{i}", StoredState(), StoredState(JobState()), {}, 1.0)
        except Exception as exc:  # what moto raised unserialized: dictionary changed size during iteration
            errors.append(exc)

    threads = [threading.Thread(target=decide, args=(w,)) for w in range(8)]

    # When they run at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then every decision committed
    assert errors == []
    assert len(store.load_many([f"job#sagemaker#{w}-{i}" for w in range(8) for i in range(25)])) == 200
    assert all(s.version == 1 for s in store.load_many([f"job#sagemaker#{w}-0" for w in range(8)]).values())


def test_search_labels_each_series_and_plain_queries_still_work() -> None:
    # Given two hosts' metric and one unrelated metric, a minute ago
    cloudwatch = boto3.client("cloudwatch")
    at = datetime.fromtimestamp(time.time() - 120, UTC)
    for host, value in (("job/algo-1", 1.0), ("job/algo-2", 2.0), ("other/algo-1", 9.0)):
        cloudwatch.put_metric_data(
            Namespace="ns",
            MetricData=[
                {"MetricName": "m", "Dimensions": [{"Name": "Host", "Value": host}], "Timestamp": at, "Value": value}
            ],
        )
    search = {
        "Id": "s",
        "Expression": "SEARCH('{ns,Host} MetricName=\"m\" \"job/\"', 'Average', 60)",
        "Label": "${PROP('Dim.Host')}",
    }
    plain = {
        "Id": "p",
        "MetricStat": {
            "Metric": {"Namespace": "ns", "MetricName": "m", "Dimensions": [{"Name": "Host", "Value": "other/algo-1"}]},
            "Period": 60,
            "Stat": "Sum",
        },
    }

    # When both are read in one call
    results = cloudwatch.get_metric_data(
        MetricDataQueries=[search, plain],
        StartTime=datetime.fromtimestamp(time.time() - 600, UTC),
        EndTime=datetime.fromtimestamp(time.time(), UTC),
    )["MetricDataResults"]

    # Then the SEARCH gave one series per matching host, labelled by host, and the plain query its own
    by_label = {(r["Id"], r["Label"]): r["Values"] for r in results}
    assert by_label == {("s", "job/algo-1"): [1.0], ("s", "job/algo-2"): [2.0], ("p", "m Sum"): [9.0]}


def test_a_search_with_groups_of_alternatives_matches_one_of_each() -> None:
    # Given three instances' utilization and memory, and their power (a metric the SEARCH does not name)
    cloudwatch = boto3.client("cloudwatch")
    at = datetime.fromtimestamp(time.time() - 120, UTC)
    for instance, value in (("i-1", 1.0), ("i-2", 2.0), ("i-3", 3.0)):
        dims = [{"Name": "InstanceId", "Value": instance}]
        data = [{"MetricName": m, "Dimensions": dims, "Timestamp": at, "Value": value} for m in ("util", "mem", "pow")]
        cloudwatch.put_metric_data(Namespace="CWAgent", MetricData=data)
    search = {
        "Id": "s",
        "Expression": 'SEARCH(\'{CWAgent,InstanceId} (MetricName="util" OR MetricName="mem") ("i-1" OR "i-3")\', '
        "'Average', 60)",
        "Label": "${PROP('MetricName')} job ${PROP('Dim.InstanceId')}",
    }

    # When it is read
    results = cloudwatch.get_metric_data(
        MetricDataQueries=[search],
        StartTime=datetime.fromtimestamp(time.time() - 600, UTC),
        EndTime=datetime.fromtimestamp(time.time(), UTC),
    )["MetricDataResults"]

    # Then each named metric of each named instance came back, labelled by both, and nothing else
    assert {r["Label"]: r["Values"] for r in results} == {
        "util job i-1": [1.0],
        "mem job i-1": [1.0],
        "util job i-3": [3.0],
        "mem job i-3": [3.0],
    }


def test_other_logs_insights_queries_go_to_moto() -> None:
    # Given a log stream with two lines
    logs = boto3.client("logs")
    logs.create_log_group(logGroupName="g")
    logs.create_log_stream(logGroupName="g", logStreamName="s")
    now_ms = int(time.time() * 1000)
    logs.put_log_events(
        logGroupName="g",
        logStreamName="s",
        logEvents=[{"timestamp": now_ms - 1000, "message": "a"}, {"timestamp": now_ms, "message": "b"}],
    )

    # When a fields/sort/limit query runs, and the last-event query with a stream filter
    other = logs.start_query(
        logGroupName="g",
        startTime=0,
        endTime=now_ms // 1000 + 1,
        queryString="fields @message | sort @timestamp desc | limit 1",
    )
    last = logs.start_query(
        logGroupName="g",
        startTime=0,
        endTime=now_ms // 1000 + 1,
        queryString="filter @logStream like /^s$/ | stats max(@timestamp) as last by @logStream",
    )

    # Then moto answered the first, and the extension the second
    assert [
        f["value"]
        for row in logs.get_query_results(queryId=other["queryId"])["results"]
        for f in row
        if f["field"] == "@message"
    ] == ["b"]
    rows = logs.get_query_results(queryId=last["queryId"])["results"]
    assert rows == [
        [{"field": "@logStream", "value": "s"}, {"field": "last", "value": moto_logs_insights.timestamp_text(now_ms)}]
    ]


def test_describe_alarms_applies_every_filter_together_and_pages() -> None:
    # Given 120 alarms under one prefix, one of them in ALARM, and an alarm in ALARM under another prefix
    cloudwatch = boto3.client("cloudwatch")
    for name in [*(f"sw-{i:03d}" for i in range(120)), "other-1"]:
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            MetricName="m",
            Namespace="n",
            Statistic="Sum",
            Period=60,
            EvaluationPeriods=1,
            Threshold=1,
            ComparisonOperator="GreaterThanThreshold",
        )
    for name in ("sw-007", "other-1"):
        cloudwatch.set_alarm_state(AlarmName=name, StateValue="ALARM", StateReason="test")

    # When the prefix and the state are asked together / Then only the prefix's alarm in ALARM answers
    in_alarm = cloudwatch.describe_alarms(AlarmNamePrefix="sw-", StateValue="ALARM")
    assert [a["AlarmName"] for a in in_alarm["MetricAlarms"]] == ["sw-007"]
    # And the prefix alone answers 100 a page at most, then the rest after the NextToken
    first = cloudwatch.describe_alarms(AlarmNamePrefix="sw-", MaxRecords=100)
    rest = cloudwatch.describe_alarms(AlarmNamePrefix="sw-", MaxRecords=100, NextToken=first["NextToken"])
    assert (len(first["MetricAlarms"]), len(rest["MetricAlarms"]), "NextToken" in rest) == (100, 20, False)
    # And without MaxRecords a page is 50, as on CloudWatch
    assert len(cloudwatch.describe_alarms()["MetricAlarms"]) == 50


def test_a_resources_tags_read_by_its_id_are_those_describe_tags_gives() -> None:
    # Given instances and a volume, each tagged at launch or later, some tags shared
    moto_ec2.install()
    ec2 = boto3.client("ec2")
    tags = [
        {"ResourceType": "instance", "Tags": [{"Key": "stallwatch:job", "Value": "a"}, {"Key": "Name", "Value": "n"}]}
    ]
    ids = [i["InstanceId"] for i in ec2.run_instances(
        ImageId="ami-12c6146b", InstanceType="p4d.24xlarge", MinCount=3, MaxCount=3, TagSpecifications=tags
    )["Instances"]]  # fmt: skip
    ec2.create_tags(Resources=ids[:1], Tags=[{"Key": "stallwatch:job", "Value": "b"}, {"Key": "extra", "Value": ""}])
    volume = ec2.create_volume(AvailabilityZone="us-east-1a", Size=8)["VolumeId"]
    ec2.create_tags(Resources=[volume], Tags=[{"Key": "stallwatch:job", "Value": "a"}])

    # Then each one's tags are what a DescribeTags of its id answers, in its order, with no other resource's
    for resource in [*ids, volume]:
        described = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [resource]}])["Tags"]
        expected = [{"Key": t["Key"], "Value": t["Value"]} for t in described]
        if resource == volume:
            [held] = ec2.describe_volumes(VolumeIds=[volume])["Volumes"]
        else:
            [held] = ec2.describe_instances(InstanceIds=[resource])["Reservations"][0]["Instances"]
        assert held["Tags"] == expected
    assert ec2.describe_instances(InstanceIds=ids[:1])["Reservations"][0]["Instances"][0]["Tags"] == [
        {"Key": "stallwatch:job", "Value": "b"},
        {"Key": "Name", "Value": "n"},
        {"Key": "extra", "Value": ""},
    ]


def test_an_image_looked_up_by_its_exact_id_is_the_one_the_filter_finds() -> None:
    # Given moto's images, an exact id, a missing one, and patterns
    moto_ec2.install()
    backend = ec2_backends[DEFAULT_ACCOUNT][DEFAULT_REGION]
    some = next(iter(backend.amis))
    for image_id in [some, "ami-00000000", some[:-1] + "?", "ami-*"]:
        # Then the image found is the one moto's own filter finds (a pattern is still filtered)
        found = backend.describe_images(filters={"image-id": image_id})
        assert found == generic_filter({"image-id": image_id}, list(backend.amis.values()))
    assert len(backend.describe_images(filters={"image-id": "ami-*"})) == len(backend.amis)
    # And an instance launched from it takes its architecture from it
    ec2 = boto3.client("ec2")
    [instance] = ec2.run_instances(ImageId=some, InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1)["Instances"]
    assert instance["Architecture"] == backend.amis[some].architecture


def test_start_instances_moves_launch_time_and_times_can_be_set() -> None:
    # Given an instance launched, then stopped (moto keeps its first LaunchTime; EC2 reports the latest start)
    moto_ec2.install()
    ec2 = boto3.client("ec2")
    (instance,) = ec2.run_instances(ImageId="ami-12c6146b", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1)[
        "Instances"
    ]
    instance_id = instance["InstanceId"]
    moto_ec2.set_instance_times([instance_id], launched=1_790_000_000.0)
    ec2.stop_instances(InstanceIds=[instance_id])
    moto_ec2.set_instance_times([instance_id], stopped=1_790_003_600.0)

    def described() -> dict:
        return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]

    # Then the stop's time is in StateTransitionReason, as EC2 writes it
    stopped = described()
    assert stopped["LaunchTime"].timestamp() == 1_790_000_000.0
    assert stopped["StateTransitionReason"] == "User initiated (2026-09-21 15:13:20 GMT)"

    # When it is started again, Then its LaunchTime is the new start
    before = time.time()
    ec2.start_instances(InstanceIds=[instance_id])
    assert described()["LaunchTime"].timestamp() >= int(before)


def _log_group_with(lines: list[str]) -> None:
    logs = boto3.client("logs")
    logs.create_log_group(logGroupName="/g")
    logs.create_log_stream(logGroupName="/g", logStreamName="s")
    now_ms = int(time.time() * 1000)  # CloudWatch Logs refuses events older than 14 days
    events = [{"timestamp": now_ms + i, "message": line} for i, line in enumerate(lines)]
    logs.put_log_events(logGroupName="/g", logStreamName="s", logEvents=events)


def _filtered(pattern: str) -> list[str]:
    response = boto3.client("logs").filter_log_events(logGroupName="/g", filterPattern=pattern)
    return [e["message"] for e in response["events"]]


def test_filter_log_events_keeps_lines_holding_any_of_the_question_marked_terms() -> None:
    # Given a stream of ordinary lines and two fatal ones
    _log_group_with(["step 1 loss 2.3", "RuntimeError: CUDA error: boom", "step 2 loss 2.2", "Traceback (most"])
    # When filtered by any of two phrases / Then only the lines holding one come back, case-sensitively
    assert _filtered('?"CUDA error" ?"Traceback"') == ["RuntimeError: CUDA error: boom", "Traceback (most"]
    assert _filtered('?"cuda error"') == []


def test_filter_log_events_needs_every_plain_term_and_none_excluded() -> None:
    _log_group_with(["ERROR disk full", "ERROR net down", "WARN disk slow"])
    assert _filtered("ERROR disk") == ["ERROR disk full"]
    assert _filtered('ERROR -"net"') == ["ERROR disk full"]
    assert len(_filtered("")) == 3


def test_a_stacks_topic_policy_replaces_the_topics_and_a_tagged_keys_policy_is_json_text() -> None:
    # Given a template with a tagged key, a topic encrypted with it, and the topic's policy
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Principal": "*", "Action": "sns:Publish"}]}
    key_policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "kms:*"}]}
    template = {
        "Resources": {
            "Key": {
                "Type": "AWS::KMS::Key",
                "Properties": {"KeyPolicy": key_policy, "Tags": [{"Key": "a", "Value": "b"}]},
            },
            "Topic": {"Type": "AWS::SNS::Topic", "Properties": {"KmsMasterKeyId": {"Fn::GetAtt": ["Key", "Arn"]}}},
            "Policy": {
                "Type": "AWS::SNS::TopicPolicy",
                "Properties": {"Topics": [{"Ref": "Topic"}], "PolicyDocument": policy},
            },
        }
    }

    # When the stack is created
    boto3.client("cloudformation").create_stack(StackName="s", TemplateBody=json.dumps(template))

    # Then the topic's policy is the stack's, and the key keeps its policy as KMS does: JSON text
    [topic] = boto3.client("sns").list_topics()["Topics"]
    attributes = boto3.client("sns").get_topic_attributes(TopicArn=topic["TopicArn"])["Attributes"]
    assert json.loads(attributes["Policy"]) == policy
    kms = boto3.client("kms")
    assert json.loads(kms.get_key_policy(KeyId=attributes["KmsMasterKeyId"], PolicyName="default")["Policy"]) == (
        key_policy
    )
    assert kms.list_resource_tags(KeyId=attributes["KmsMasterKeyId"])["Tags"] == [{"TagKey": "a", "TagValue": "b"}]


def test_filter_log_events_keeps_lines_a_regex_pattern_finds_anywhere_case_sensitively() -> None:
    # Given ordinary lines, a tqdm bar ending in Killed and an NCCL warning
    _log_group_with(
        ["step 1 loss 2.3", "20%|##  | 216/1063 [00:27<02:17,  6.17it/s]Killed", "host:1:2 [0] NCCL WARN x"]
    )
    # When filtered by a %regex% (CloudWatch's subset: `.` for a space) / Then it matches inside words, case-sensitively
    assert _filtered("%[Kk]illed|NCCL.WARN%") == [
        "20%|##  | 216/1063 [00:27<02:17,  6.17it/s]Killed",
        "host:1:2 [0] NCCL WARN x",
    ]
    assert _filtered("%nccl.warn%") == []


@pytest.mark.parametrize(
    "pattern",
    ["%CUDA error%", "%(Killed|OOM)%", "%it's%", "%" + "a|" * 520 + "b%"],
    ids=["space", "parentheses", "quote", "over-1024"],
)
def test_filter_log_events_refuses_a_pattern_cloudwatch_refuses(pattern: str) -> None:
    # Given a pattern CloudWatch Logs rejects (a character its regex cannot hold, or over 1,024 characters)
    _log_group_with(["CUDA error"])
    # When filtered with it / Then the request fails as CloudWatch's does, instead of matching
    with pytest.raises(ClientError, match="InvalidParameterException"):
        _filtered(pattern)


def test_every_session_shares_one_parse_of_the_service_models_and_its_clients_still_work() -> None:
    # Given the shared loader (tests/conftest.py installs it), and three sessions made one after another
    sessions = [boto3.Session(region_name="us-east-1") for _ in range(3)]
    loaders = [s._session.get_component("data_loader") for s in sessions]

    # Then they share one loader, to which boto3's data folder was added once, not once per session
    assert all(loader is loaders[0] for loader in loaders)
    boto3_data = [p for p in loaders[0].search_paths if p.endswith(os.path.join("boto3", "data"))]
    assert len(boto3_data) == 1
    # And each session's clients answer as ever, and its resources load from boto3's folder
    for i, session in enumerate(sessions):
        session.client("dynamodb").create_table(
            TableName=f"t{i}",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    assert sorted(sessions[2].resource("dynamodb").meta.client.list_tables()["TableNames"]) == ["t0", "t1", "t2"]

    # And uninstalled, a new session parses its own models again
    boto_models.uninstall()
    try:
        assert boto3.Session()._session.get_component("data_loader") is not loaders[0]
    finally:
        boto_models.install()


class _Handlers:
    def bare(self, request: object) -> None: ...

    def kind(self, **kwargs: object) -> None:
        self.called = kwargs["value"]


def test_each_handler_is_checked_and_each_event_name_aliased_once_a_process_as_botocore_would_each_time() -> None:
    # Given two sessions of the process (the shared answers installed), and handlers with and without **kwargs
    emitters = [boto3.Session()._session.get_component("event_emitter") for _ in range(2)]
    first, second = _Handlers(), _Handlers()
    for emitter, handlers in zip(emitters, [first, second], strict=True):
        # Then a handler without **kwargs is refused on each, as a bound method as well as its function
        for handler in (handlers.bare, _Handlers.bare):
            with pytest.raises(ValueError, match=r"must accept keyword arguments \(\*\*kwargs\)"):
                emitter.register("before-call.ec2.DescribeInstances", handler)
        # And a handler registered under a service's old name (botocore's aliases) hears the event of its new name
        emitter.register("stallwatch-test.autoscaling.DescribeAutoScalingGroups", handlers.kind)
    emitters[1].emit("stallwatch-test.auto-scaling.DescribeAutoScalingGroups", value=2)
    assert not hasattr(first, "called")
    assert second.called == 2


def test_each_service_has_one_client_class_and_each_client_its_own_events() -> None:
    # Given two sessions' DynamoDB clients (the shared class installed), a handler on the first one's events
    first, second = (boto3.Session(region_name="us-east-1").client("dynamodb") for _ in range(2))
    seen: list[str] = []
    first.meta.events.register("before-call.dynamodb.ListTables", lambda model, **_: seen.append(model.name))

    # Then they share the class, and each call goes through its own client's events alone
    assert type(first) is type(second)
    with moto.mock_aws():
        second.list_tables()
        assert seen == []
        first.list_tables()
    assert seen == ["ListTables"]
