"""The deployment's configuration: one validated model for the stacks and the Lambdas.

The stacks build it from cdk.json context (key ``stallwatch``) and/or a JSON file, so a
bad value fails synth with the field named; the Lambdas read it from their environment (``STALLWATCH_CONFIG``).

    config = StallwatchConfig.model_validate({"policy": {"mode": "enforce"}})
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.platforms.interface import PlatformSettings
from stallwatch.core.policy import Policy
from stallwatch.core.signals import Platform

CONFIG_ENV = "STALLWATCH_CONFIG"
# The console URL of the deployment's job dashboard, set by the stack: the end-of-run summary links to it.
JOB_DASHBOARD_URL_ENV = "JOB_DASHBOARD_URL"
# The names of the SSM documents of EC2's recovery in place: the stack creates them, the functions read them.
HEALTH_CHECK_DOCUMENT_ENV = "HEALTH_CHECK_DOCUMENT"
RESTART_DOCUMENT_ENV = "RESTART_DOCUMENT"
# The incident/job-state table's schema: the stacks create it, `stallwatch.aws.store` reads and writes it.
TABLE_PARTITION_KEY = "pk"
TABLE_SORT_KEY = "sk"
TABLE_TTL_ATTRIBUTE = "expires_at"
# The sweeper function's timeout: the stacks set it, and the runtime's claims and clean-ups outlast it.
SWEEPER_TIMEOUT_SECONDS = 300
ON_ALARM_TIMEOUT_SECONDS = 120  # one decision's time
# on_log_line decides a fatal line's job and the rechecks its decisions ask for within minutes (`core.wake`): a rank's
# death confirmed 3 minutes after its last words, then stopped 2 minutes after the warning.
ON_LOG_LINE_TIMEOUT_SECONDS = 600
# A Slack press is applied by an asynchronous invocation of the endpoint, which Lambda keeps (retries, throttles) this
# long (the stack's MaximumEventAge); older, it goes to the on-failure destination and is posted back as not applied.
PRESS_MAX_AGE_SECONDS = 600
# The Slack endpoint's reserved concurrency (`SlackConfig.reserved_concurrency`): a press is one request and one
# deferred invocation. Lambda keeps at least 100 of the account's concurrency unreserved.
SLACK_RESERVED_CONCURRENCY = 10
SLACK_RESERVED_CONCURRENCY_MAX = 100
# An alarm of a job decided by an alarm less than this ago is coalesced into that decision (a hang fires every host's
# alarms within a period or two); the sweeper decides a job whose alarm went to ALARM after its last decision.
ALARM_COALESCE_SECONDS = 120
ALARM_PREFIX_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,30}-$"
# The control plane's health alarms are named <alarm_prefix>health-<what>, never a per-job alarm's name (those go on
# with a platform and a dot): the health topic's grants to CloudWatch name them so (stacks/notifications.py).
HEALTH_ALARM_NAME_PART = "health-"
# Where EC2 training logs are read (deploy/ec2/cloudwatch-agent.json ships them there, one stream per instance id).
EC2_LOG_GROUP = "/stallwatch/ec2"
LOG_GROUP_PATTERN = r"^[.\-_/#A-Za-z0-9]{1,512}$"


class SlackMode(StrEnum):
    """How alerts reach Slack: an incoming webhook, or a bot token and a channel."""

    WEBHOOK = "webhook"
    BOT = "bot"


def slack_mode_of(secret: Mapping[str, Any]) -> SlackMode | None:
    """The mode the Slack secret's fields choose: a ``webhook_url`` posts by webhook; else a ``bot_token`` and a
    ``channel`` post as the bot (and can edit the alerts); else None (nothing can be posted)."""
    if secret.get("webhook_url"):
        return SlackMode.WEBHOOK
    if secret.get("bot_token") and secret.get("channel"):
        return SlackMode.BOT
    return None


class SlackConfig(BaseModel):
    """Where the Slack credentials live. The secret holds JSON: ``{"webhook_url": ..., "signing_secret": ...}`` or
    ``{"bot_token": ..., "channel": ..., "signing_secret": ...}``; its fields choose the mode (`slack_mode_of`),
    read at run time, so changing mode needs no deploy."""

    model_config = ConfigDict(extra="forbid")

    secret_arn: str | None = Field(None, description="Import an existing secret; None creates an empty one.")
    allowed_user_ids: list[str] = Field(default_factory=list, description="Slack users who may press the buttons.")
    allowed_group_ids: list[str] = Field(default_factory=list, description="Slack user groups who may press them.")
    reserved_concurrency: int | None = Field(
        SLACK_RESERVED_CONCURRENCY,
        ge=2,
        le=SLACK_RESERVED_CONCURRENCY_MAX,
        description="Concurrent executions reserved for the Slack endpoint, which are also its most: a flood of "
        "requests to its public URL can never use up the account's concurrency the watchdog needs. The account "
        "must keep 100 unreserved after it (a new account's quota can be lower: null reserves nothing).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_mode(cls, data: Any) -> Any:
        if isinstance(data, dict) and "mode" in data:
            raise ValueError(
                "slack.mode is not a setting: the secret's fields choose the mode (webhook_url for webhook; "
                "bot_token and channel for bot); delete it from the config"
            )
        return data

    @field_validator("secret_arn")
    @classmethod
    def _arn(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+$", value):
            raise ValueError(f"not a Secrets Manager secret ARN: {value!r}")
        return value


# The subscription filter each subscribed log group holds for a deployment (stacks/log_subscriptions.py).
FATAL_LINES_FILTER = "{deployment}-fatal-lines"


class PlatformsSettings(BaseModel):
    """`platforms:`, one sub-model per platform of the registry (`PlatformDescription.settings`), each under its name:
    ``{"platforms": {"slurm": {"monitor": true}}}``."""

    model_config = ConfigDict(extra="forbid")

    def of(self, platform: Platform | str) -> PlatformSettings:
        """The settings of `platform`."""
        settings: PlatformSettings = getattr(self, Platform(platform).value)
        return settings


Platforms = create_model(  # type: ignore[call-overload]
    "Platforms",
    __base__=PlatformsSettings,
    __doc__=PlatformsSettings.__doc__,
    **{
        platform.value: (description.settings, Field(default_factory=description.settings))
        for platform, description in DESCRIPTIONS.items()
    },
)
# The keys each platform's settings had before `platforms:` (read for one release, with a warning): the policy's
# `monitor_<platform>` and `log_subscriptions.<platform>`, by their new field.
LEGACY_MONITOR = "monitor_{platform}"
LEGACY_SUBSCRIPTIONS = "log_subscriptions"


_BOOLEAN = TypeAdapter(bool)


class DeprecatedSetting(FutureWarning):
    """A config key read for one more release; the message says what to write instead."""


def _moved(raw: dict[str, Any], old: str, platform: str, field: str, value: Any) -> None:
    """Put the old key's `value` at `platforms.<platform>.<field>`, with a warning; an error where the new key says
    otherwise, or the value is not a boolean (naming the old key)."""
    new = f"platforms.{platform}.{field}"
    try:
        value = _BOOLEAN.validate_python(value)
    except ValidationError:
        raise ValueError(f"{old}: expected true or false, got {value!r} (deprecated: write {new})") from None
    platforms = raw.setdefault("platforms", {})
    settings = platforms.setdefault(platform, {}) if isinstance(platforms, dict) else None
    if not isinstance(settings, dict):
        return  # the new key's own validation names it
    if field in settings and settings[field] != value:
        raise ValueError(f"{old} ({value}) and {new} ({settings[field]}) disagree: keep {new} only")
    settings[field] = value
    warnings.warn(f"{old} is deprecated and read for this release only: write {new}", DeprecatedSetting, stacklevel=2)


class StallwatchConfig(BaseModel):
    """Everything a deployment is configured with."""

    model_config = ConfigDict(extra="forbid")

    policy: Policy = Field(default_factory=Policy)
    slack: SlackConfig = Field(default_factory=SlackConfig)
    alarm_prefix: str = Field(
        "stallwatch-", description="Every per-job alarm name starts with this; IAM is scoped to it."
    )
    sweeper_minutes: int = Field(5, ge=1, le=60, description="How often the sweeper runs.")
    checkup_minutes: int = Field(
        20,
        ge=0,
        le=1440,
        description="The sweeper also decides a job whose last decision is this old (0: never): stragglers and "
        "slowdowns raise no alarm, and the job's learned cadence stays fresh.",
    )
    incident_ttl_days: int = Field(90, ge=1, le=3650, description="How long incident records are kept.")
    regions: list[str] = Field(default_factory=list, description="Regions to deploy to; empty: environment-agnostic.")
    notification_emails: list[str] = Field(default_factory=list, description="Also notified of control-plane health.")
    ec2_log_group: str = Field(
        EC2_LOG_GROUP,
        description="EC2 jobs' log group (streams named by instance id); a job's `stallwatch:log-group` tag may name "
        "another group under it.",
    )
    platforms: Platforms = Field(default_factory=Platforms, description="Each platform's settings, by its name.")

    @model_validator(mode="before")
    @classmethod
    def _legacy_keys(cls, data: Any) -> Any:
        """`policy.monitor_<platform>` and `log_subscriptions.<platform>`, moved under `platforms:` with a warning."""
        if not isinstance(data, dict):
            return data
        raw = copy.deepcopy(data)  # the caller's dicts are left as they were
        policy = raw.get("policy")
        if isinstance(policy, dict):
            for platform in DESCRIPTIONS:
                old = LEGACY_MONITOR.format(platform=platform.value)
                if old in policy:
                    _moved(raw, f"policy.{old}", platform.value, "monitor", policy.pop(old))
        subscriptions = raw.pop(LEGACY_SUBSCRIPTIONS, None)
        if subscriptions is not None:
            if not isinstance(subscriptions, dict):
                raise ValueError(f"{LEGACY_SUBSCRIPTIONS}: expected an object (deprecated: write platforms.<name>)")
            for name, value in subscriptions.items():
                if name not in {p.value for p in DESCRIPTIONS}:
                    raise ValueError(f"{LEGACY_SUBSCRIPTIONS}.{name}: not a platform ({', '.join(DESCRIPTIONS)})")
                _moved(raw, f"{LEGACY_SUBSCRIPTIONS}.{name}", name, "log_subscription", value)
        return raw

    def watches(self, platform: Platform | str) -> bool:
        """Whether the deployment watches `platform`'s jobs (`platforms.<name>.monitor`)."""
        return self.platforms.of(platform).monitor

    def log_group(self, platform: Platform | str) -> str | None:
        """The log group `platform`'s jobs' hosts write to (`PlatformDescription.log_group`); None where it has none
        of its own."""
        return DESCRIPTIONS[Platform(platform)].log_group(self.ec2_log_group)

    def subscribes(self, platform: Platform | str) -> bool:
        """Whether a subscription filter sends the fatal lines of `platform`'s log group to on_log_line, where the
        platform is watched (`platforms.<name>.log_subscription`, and it has a group of its own)."""
        return self.platforms.of(platform).log_subscription and self.log_group(platform) is not None

    def subscribed_log_groups(self) -> dict[Platform, str]:
        """The log group of each watched platform whose fatal lines a subscription filter sends to on_log_line."""
        return {
            p: group for p in DESCRIPTIONS if self.watches(p) and self.subscribes(p) and (group := self.log_group(p))
        }

    @property
    def health_alarm_prefix(self) -> str:
        """Where the names of the deployment's health alarms start."""
        return f"{self.alarm_prefix}{HEALTH_ALARM_NAME_PART}"

    @field_validator("alarm_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.match(ALARM_PREFIX_PATTERN, value):
            raise ValueError(
                f"must match {ALARM_PREFIX_PATTERN} (letters, digits, _ or -, ending in '-'), got {value!r}"
            )
        return value

    @field_validator("ec2_log_group")
    @classmethod
    def _log_group(cls, value: str) -> str:
        if not re.match(LOG_GROUP_PATTERN, value):
            raise ValueError(f"not a CloudWatch Logs group name: {value!r}")
        return value

    @field_validator("regions")
    @classmethod
    def _regions(cls, value: list[str]) -> list[str]:
        for region in value:
            if not re.match(r"^[a-z]{2}(-gov)?-[a-z]+-\d$", region):
                raise ValueError(f"not an AWS region: {region!r}")
        return value
