"""The runtime the Lambdas share: configuration, AWS clients, the table and Slack, from the environment.

rt = runtime()                       # created once per container, on first use (no AWS call at import time)
rt.source(Platform.SAGEMAKER)        # the signal source for one platform
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError

from stallwatch.aws.buttons import deployment_id
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.recoveries import Recoveries
from stallwatch.aws.slack import SlackNotifier
from stallwatch.aws.source import AwsSignalSource
from stallwatch.aws.store import Store
from stallwatch.core.config import CONFIG_ENV, HEALTH_CHECK_DOCUMENT_ENV, RESTART_DOCUMENT_ENV, StallwatchConfig
from stallwatch.core.signals import Platform


class LambdaEnvironment(BaseModel):
    """The functions' environment variables."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=3)
    slack_secret_arn: str | None = Field(None, alias="SLACK_SECRET_ARN")
    alarm_action_arn: str = Field("", alias="ALARM_ACTION_ARN")
    config: Json[StallwatchConfig] | None = Field(None, alias=CONFIG_ENV)
    health_check_document: str = Field("", alias=HEALTH_CHECK_DOCUMENT_ENV)
    restart_document: str = Field("", alias=RESTART_DOCUMENT_ENV)


class ConfigurationError(RuntimeError):
    """A required environment variable is missing or invalid."""


@dataclass
class Runtime:
    """Everything the logic needs from the outside world; built from the environment in Lambda."""

    config: StallwatchConfig
    clients: AwsClients
    store: Store
    notifier: SlackNotifier
    alarm_action_arn: str
    clock: Callable[[], float] = time.time
    # Recovery in place's SSM documents (the stack's); "" where the deployment has none: jobs are stopped instead.
    health_check_document: str = ""
    restart_document: str = ""

    @classmethod
    def from_env(cls) -> Runtime:
        try:
            env = LambdaEnvironment.model_validate(dict(os.environ))
        except ValidationError as exc:
            raise ConfigurationError(f"invalid Lambda environment: {exc}") from exc
        config = env.config or StallwatchConfig()
        clients = AwsClients()
        return cls(
            config=config,
            clients=clients,
            store=Store(clients.dynamodb, env.table_name, config.incident_ttl_days),
            notifier=SlackNotifier(clients.secretsmanager, env.slack_secret_arn or config.slack.secret_arn),
            alarm_action_arn=env.alarm_action_arn,
            health_check_document=env.health_check_document,
            restart_document=env.restart_document,
        )

    @functools.cached_property
    def recoveries(self) -> Recoveries:
        """Recovery in place's items in the table."""
        return Recoveries(self.store)

    @functools.cached_property
    def deployment_id(self) -> str:
        """This deployment's id, carried by the Slack buttons and checked when they are pressed."""
        return deployment_id(self.clients.session.region_name or "", self.store.table)

    def source(self, platform: Platform) -> AwsSignalSource:
        return AwsSignalSource(self.clients, platform, self.config.policy, self.config.ec2_log_group)


@functools.cache
def runtime() -> Runtime:
    """The container's runtime, created on first use (no AWS call at import time)."""
    return Runtime.from_env()
