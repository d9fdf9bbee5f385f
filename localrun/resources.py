"""The stack's runtime resources, created in moto: the incident table, the Slack secret, the functions' environment.

The table follows the schema in ``stallwatch.store`` (``pk``/``sk``, TTL ``expires_at``); the environment is the
one the stacks give the functions (see docs/design.md), with the config built by `StallwatchConfig`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localrun.lambda_runtime import function_arn
from localrun.scenarios import DEMO_ALARM_PERIOD_S
from stallwatch.config import CONFIG_ENV, StallwatchConfig
from stallwatch.policy import Policy, Thresholds

TABLE_NAME = "stallwatch-incidents"
PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE = "pk", "sk", "expires_at"  # stallwatch.store's schema
SECRET_NAME = "stallwatch/slack"
SERVICE_NAME = "stallwatch"
ON_ALARM = "on-alarm"
ON_JOB_STATE = "on-job-state"
SWEEPER = "sweeper"


@dataclass(frozen=True)
class RuntimeResources:
    """What the functions are configured with."""

    config: StallwatchConfig
    table_name: str
    secret_arn: str

    def function_env(self) -> dict[str, str]:
        """The Lambda functions' environment variables, as the stack sets them."""
        return {
            CONFIG_ENV: self.config.model_dump_json(),
            "TABLE_NAME": self.table_name,
            "SLACK_SECRET_ARN": self.secret_arn,
            "ALARM_ACTION_ARN": function_arn(ON_ALARM),
            "POWERTOOLS_SERVICE_NAME": SERVICE_NAME,
        }


def demo_config() -> StallwatchConfig:
    """The deployment's config for the demo: the defaults (notify mode; the job opts in to enforce by tag), with
    high-resolution alarm periods, which the control plane also reads the metrics at."""
    return StallwatchConfig(policy=Policy(thresholds=Thresholds(alarm_period_seconds=DEMO_ALARM_PERIOD_S)))


def create_resources(dynamodb: Any, secretsmanager: Any, webhook_url: str) -> RuntimeResources:
    """Create the table (with TTL) and the Slack webhook secret."""
    dynamodb.create_table(
        TableName=TABLE_NAME,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=TABLE_NAME, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
    )
    secret = secretsmanager.create_secret(Name=SECRET_NAME, SecretString=json.dumps({"webhook_url": webhook_url}))
    return RuntimeResources(config=demo_config(), table_name=TABLE_NAME, secret_arn=secret["ARN"])
