"""The stack's runtime resources, created in moto: the incident table, the Slack secret, the recheck schedule group,
recovery in place's SSM documents (deploy/ssm, as the stack creates them), the functions' environment.

The table follows the schema in ``stallwatch.core.config`` (``pk``/``sk``, TTL ``expires_at``); the functions'
environment is named by ``stallwatch.runtime.environment.LambdaEnvironment``, with the config built by
`StallwatchConfig`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localrun.lambda_runtime import function_arn
from localrun.local_aws import ACCOUNT_ID
from localrun.scenarios import DEMO_ALARM_PERIOD_S
from stallwatch.core.config import (
    CONFIG_ENV,
    TABLE_PARTITION_KEY,
    TABLE_SORT_KEY,
    TABLE_TTL_ATTRIBUTE,
    StallwatchConfig,
)
from stallwatch.core.contract import SERVICE
from stallwatch.core.policy import Policy, Thresholds
from stallwatch.core.signals import Platform
from stallwatch.runtime.environment import LambdaEnvironment

TABLE_NAME = "stallwatch-incidents"
SECRET_NAME = "stallwatch/slack"
DOCUMENTS_DIR = Path(__file__).resolve().parent.parent / "deploy" / "ssm"
HEALTH_CHECK_DOCUMENT = "stallwatch-health-check"
RESTART_DOCUMENT = "stallwatch-restart-training"
DOCUMENT_FILES = {
    HEALTH_CHECK_DOCUMENT: "health-check.yaml",
    RESTART_DOCUMENT: "restart-training.yaml",
}
ON_ALARM = "on-alarm"
ON_JOB_STATE = "on-job-state"
SWEEPER = "sweeper"
RECHECK_GROUP = "stallwatch-rechecks"
RECHECK_ROLE_ARN = f"arn:aws:iam::{ACCOUNT_ID}:role/stallwatch-rechecks"  # moto does not check who assumes it


@dataclass(frozen=True)
class RuntimeResources:
    """What the functions are configured with."""

    config: StallwatchConfig
    table_name: str
    secret_arn: str
    recheck_group: str
    documents: bool = False  # recovery in place's SSM documents were created

    def function_env(self) -> dict[str, str | None]:
        """The Lambda functions' environment variables, named by the model the functions read them with (None:
        not set)."""
        names = LambdaEnvironment(
            table_name=self.table_name,
            slack_secret_arn=self.secret_arn,
            alarm_action_arn=function_arn(ON_ALARM),
            recheck_group=self.recheck_group,
            recheck_role_arn=RECHECK_ROLE_ARN,
            health_check_document=HEALTH_CHECK_DOCUMENT if self.documents else "",
            restart_document=RESTART_DOCUMENT if self.documents else "",
        ).model_dump(by_alias=True)
        return {**names, CONFIG_ENV: self.config.model_dump_json(), "POWERTOOLS_SERVICE_NAME": SERVICE}


def demo_config() -> StallwatchConfig:
    """The deployment's config for the demo: the defaults (notify mode; the job opts in to enforce by tag), with
    high-resolution alarm periods, which the control plane also reads the metrics at, and every platform watched (the
    demo runs a Slurm cluster too)."""
    return StallwatchConfig(
        policy=Policy(thresholds=Thresholds(alarm_period_seconds=DEMO_ALARM_PERIOD_S)),
        platforms={platform.value: {"monitor": True} for platform in Platform},
    )


def create_table(dynamodb: Any, table_name: str) -> None:
    """The incident/job-state table as the stack defines it: the key schema and TTL attribute from
    ``stallwatch.core.config``, on demand."""
    dynamodb.create_table(
        TableName=table_name,
        AttributeDefinitions=[
            {"AttributeName": TABLE_PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": TABLE_SORT_KEY, "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": TABLE_PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": TABLE_SORT_KEY, "KeyType": "RANGE"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TABLE_TTL_ATTRIBUTE}
    )


def create_documents(ssm: Any) -> None:
    """Stallwatch's SSM Command documents (recovery in place), from deploy/ssm (the stack
    creates them from the same files)."""
    for name, filename in DOCUMENT_FILES.items():
        content = yaml.safe_load((DOCUMENTS_DIR / filename).read_text())
        ssm.create_document(Name=name, Content=json.dumps(content), DocumentType="Command", DocumentFormat="JSON")


def create_resources(
    dynamodb: Any, secretsmanager: Any, scheduler: Any, webhook_url: str, ssm: Any = None
) -> RuntimeResources:
    """Create the table (with TTL), the Slack webhook secret, the recheck schedule group and, given an SSM client,
    the recovery documents."""
    create_table(dynamodb, TABLE_NAME)
    secret = secretsmanager.create_secret(Name=SECRET_NAME, SecretString=json.dumps({"webhook_url": webhook_url}))
    scheduler.create_schedule_group(Name=RECHECK_GROUP)
    if ssm is not None:
        create_documents(ssm)
    return RuntimeResources(
        config=demo_config(),
        table_name=TABLE_NAME,
        secret_arn=secret["ARN"],
        recheck_group=RECHECK_GROUP,
        documents=ssm is not None,
    )
