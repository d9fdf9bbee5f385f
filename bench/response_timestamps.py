"""What reading AWS's timestamps costs a decision: a 1,000-instance DescribeInstances answer parsed by botocore's
timestamp parser and by `aws.clients.aws_timestamp`, side by side in one run.

    .venv/bin/python bench/response_timestamps.py

moto answers the request once (1,000 p4d.24xlarge instances, 1,000 a page, as `aws.platforms.ec2` asks); the
answer's XML is then parsed ROUNDS times by each parser in turn, CPU time per parse. Each parse's instants must agree.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]
os.environ.update(
    {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
)

import boto3  # noqa: E402
import moto  # noqa: E402
from botocore.parsers import ResponseParserFactory  # noqa: E402

from stallwatch.aws.clients import aws_timestamp  # noqa: E402

INSTANCES = 1000
ROUNDS = 5
AMI = "ami-12c6146b"  # one of moto's built-in images


def _answer() -> tuple[dict[str, Any], Any]:
    """The raw DescribeInstances answer for INSTANCES instances, and the operation's output shape."""
    with moto.mock_aws():
        ec2 = boto3.client("ec2")
        ec2.run_instances(ImageId=AMI, InstanceType="p4d.24xlarge", MinCount=INSTANCES, MaxCount=INSTANCES)
        kept: dict[str, Any] = {}
        ec2.meta.events.register(
            "before-parse.ec2.DescribeInstances", lambda response_dict, **_: kept.update(response_dict)
        )
        ec2.describe_instances(MaxResults=INSTANCES)
    return kept, ec2.meta.service_model.operation_model("DescribeInstances").output_shape


def _cpu_per_parse(factory: ResponseParserFactory, answer: dict[str, Any], shape: Any) -> tuple[float, list[float]]:
    parser = factory.create_parser("ec2")
    start = time.process_time()
    for _ in range(ROUNDS):
        parsed = parser.parse(answer, shape)
    instants = [i["LaunchTime"].timestamp() for r in parsed["Reservations"] for i in r["Instances"]]
    return (time.process_time() - start) / ROUNDS, instants


def main() -> int:
    answer, shape = _answer()
    ours = ResponseParserFactory()
    ours.set_parser_defaults(timestamp_parser=aws_timestamp)
    botocore_s, botocore_instants = _cpu_per_parse(ResponseParserFactory(), answer, shape)
    ours_s, our_instants = _cpu_per_parse(ours, answer, shape)
    if our_instants != botocore_instants or len(our_instants) != INSTANCES:
        print("the parsers read different instants", file=sys.stderr)
        return 1
    print(f"DescribeInstances, {INSTANCES} instances, CPU per parse (mean of {ROUNDS}):")
    print(f"  botocore's timestamps  {botocore_s:.3f} s")
    print(f"  aws_timestamp          {ours_s:.3f} s   ({ours_s / botocore_s:.2f} of botocore's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
