"""The clients' timestamp parser: the instant botocore's reads, from every form AWS answers in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import moto
import pytest
from botocore.utils import parse_timestamp

from stallwatch.aws.clients import AwsClients, aws_timestamp


@pytest.mark.parametrize(
    "value",
    [
        1796600000,
        1796600000.25,
        "1796600000.25",
        "2026-12-06T22:13:20Z",
        "2026-12-06T22:13:20.250Z",
        "2026-12-06T22:13:20.250+00:00",
        "2026-12-06T23:13:20+01:00",
        "Sun, 06 Dec 2026 22:13:20 GMT",
        "2026-12-06T22:13:20.250000000Z",
    ],
)
def test_a_timestamp_is_the_instant_botocore_reads(value: str | float) -> None:
    # Given a timestamp as an AWS protocol answers it (epoch number or text, ISO 8601 with or without fractions, an
    # offset, RFC 822) / Then it is read as the same instant, and aware
    ours = aws_timestamp(value)
    assert ours.tzinfo is not None
    assert ours.timestamp() == parse_timestamp(value).timestamp()


def test_what_botocore_refuses_is_refused() -> None:
    with pytest.raises(ValueError, match="Invalid timestamp"):
        aws_timestamp("not a time")


def test_the_clients_read_responses_with_it() -> None:
    # Given a JSON protocol's epoch and a query protocol's ISO 8601 answered to the clients
    with moto.mock_aws():
        clients = AwsClients("us-east-1")
        secret = clients.secretsmanager.create_secret(Name="s", SecretString="x")["ARN"]
        created = clients.secretsmanager.describe_secret(SecretId=secret)["CreatedDate"]
        [alarm] = _alarm(clients.cloudwatch)["MetricAlarms"]
    # Then both are read by aws_timestamp: in UTC (botocore's own reads an epoch in the local zone)
    assert created.tzinfo is UTC
    assert alarm["StateUpdatedTimestamp"].tzinfo is UTC
    assert aws_timestamp(1796595200) == datetime(2026, 12, 6, 22, 13, 20, tzinfo=UTC)


def _alarm(cloudwatch: Any) -> dict[str, Any]:
    cloudwatch.put_metric_alarm(
        AlarmName="a",
        Namespace="N",
        MetricName="M",
        Statistic="Maximum",
        Period=60,
        EvaluationPeriods=1,
        Threshold=1,
        ComparisonOperator="GreaterThanThreshold",
    )
    return cloudwatch.describe_alarms(AlarmNames=["a"])
