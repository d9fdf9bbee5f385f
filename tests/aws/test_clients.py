"""The clients' timestamp parser: the instant botocore's reads, from every form AWS answers in."""

from __future__ import annotations

from datetime import UTC, datetime

import moto
import pytest
from botocore.utils import parse_timestamp

from localrun.moto_world import EXAMPLE_AMI
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
    # Given a JSON protocol's epoch and EC2's XML ISO 8601 answered to the clients
    with moto.mock_aws():
        clients = AwsClients("us-east-1")
        secret = clients.secretsmanager.create_secret(Name="s", SecretString="x")["ARN"]
        created = clients.secretsmanager.describe_secret(SecretId=secret)["CreatedDate"]
        [instance] = clients.ec2.run_instances(
            ImageId=EXAMPLE_AMI, InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1
        )["Instances"]
    # Then both are read by aws_timestamp, in UTC (botocore's own: an epoch in the local zone, ISO 8601 in dateutil's)
    assert created.tzinfo is UTC
    assert instance["LaunchTime"].tzinfo is UTC
    assert aws_timestamp(1796595200) == datetime(2026, 12, 6, 22, 13, 20, tzinfo=UTC)
