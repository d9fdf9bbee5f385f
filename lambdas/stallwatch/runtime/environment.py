"""The runtime the Lambdas share: configuration, AWS clients, the table and Slack, from the environment.

rt = runtime()                       # created once per container, on first use (no AWS call at import time)
rt.source(facts.platform)            # the platform's adapter: facts, signals, stop
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError

from stallwatch.aws.alarm_markers import AlarmMarkers
from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.buttons import deployment_id
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.event_claims import EventClaims
from stallwatch.aws.job_states import JobStates
from stallwatch.aws.pending_posts import PendingPosts
from stallwatch.aws.platforms import adapter
from stallwatch.aws.progress_watches import ProgressWatches
from stallwatch.aws.rechecks import RecheckScheduler, RecheckTarget
from stallwatch.aws.resume_tries import ResumeTries
from stallwatch.aws.slack import SlackNotifier
from stallwatch.aws.ssm import Documents
from stallwatch.aws.store import Store
from stallwatch.core.config import (
    ALARM_COALESCE_SECONDS,
    CONFIG_ENV,
    HEALTH_CHECK_DOCUMENT_ENV,
    JOB_DASHBOARD_URL_ENV,
    RESTART_DOCUMENT_ENV,
    StallwatchConfig,
)
from stallwatch.core.platforms.interface import PlatformAdapter
from stallwatch.core.signals import Platform

FOUND_RUNNING_KEPT = 1024  # jobs a container remembers having found running (the oldest are forgotten first)


class LambdaEnvironment(BaseModel):
    """The functions' environment variables."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=3)
    slack_secret_arn: str | None = Field(None, alias="SLACK_SECRET_ARN")
    alarm_action_arn: str = Field("", alias="ALARM_ACTION_ARN")
    config: Json[StallwatchConfig] | None = Field(None, alias=CONFIG_ENV)
    # Rechecks (`aws.rechecks`): without the group and the role (the replay, a deployment from before), none is
    # scheduled and the sweeper alone decides again. Their target is on_alarm (`ALARM_ACTION_ARN`, or on_alarm's own).
    recheck_group: str | None = Field(None, alias="RECHECK_SCHEDULE_GROUP")
    recheck_role_arn: str | None = Field(None, alias="RECHECK_ROLE_ARN")
    recheck_dead_letter_arn: str | None = Field(None, alias="RECHECK_DEAD_LETTER_ARN")

    def recheck_target(self) -> RecheckTarget | None:
        if not (self.recheck_group and self.recheck_role_arn):
            return None
        return RecheckTarget(
            self.recheck_group, self.recheck_role_arn, self.alarm_action_arn, self.recheck_dead_letter_arn or None
        )

    job_dashboard_url: str | None = Field(None, alias=JOB_DASHBOARD_URL_ENV)
    health_check_document: str = Field("", alias=HEALTH_CHECK_DOCUMENT_ENV)
    restart_document: str = Field("", alias=RESTART_DOCUMENT_ENV)

    def documents(self) -> Documents:
        """The deployment's SSM documents ("" where the stack named none)."""
        return Documents(self.health_check_document, self.restart_document)


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
    sleep: Callable[[float], None] = time.sleep  # a wake-up waits for the moment its decision sees the line
    rechecks: RecheckScheduler | None = None  # None: no recheck is scheduled (the sweeper decides again)
    job_dashboard_url: str | None = None  # the deployment's job dashboard, linked from the end-of-run summary
    # The stack's SSM documents (recovery in place's); "" where it has none: that action is not taken.
    documents: Documents = field(default_factory=Documents)
    # The jobs this container found running, and when (`found_running`).
    _found: dict[tuple[Platform, str], float] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls) -> Runtime:
        try:
            env = LambdaEnvironment.model_validate(dict(os.environ))
        except ValidationError as exc:
            raise ConfigurationError(f"invalid Lambda environment: {exc}") from exc
        config = env.config or StallwatchConfig()
        clients = AwsClients()
        target = env.recheck_target()
        return cls(
            config=config,
            clients=clients,
            store=Store(clients.dynamodb, env.table_name, config.incident_ttl_days),
            notifier=SlackNotifier(clients.secretsmanager, env.slack_secret_arn or config.slack.secret_arn),
            alarm_action_arn=env.alarm_action_arn,
            rechecks=RecheckScheduler(clients, target) if target else None,
            job_dashboard_url=env.job_dashboard_url,
            documents=env.documents(),
        )

    def invoked_as(self, function_arn: str) -> Runtime:
        """This runtime, its rechecks targeting `function_arn` (the invoked function's own ARN, from the Lambda
        context) where the environment names no target: on_alarm, whose environment cannot name on_alarm (a
        function's environment may not refer to the function itself)."""
        if self.rechecks is not None and not self.rechecks.target.function_arn:
            self.rechecks = self.rechecks.targeting(function_arn)
        return self

    @functools.cached_property
    def states(self) -> JobStates:
        """The jobs' states and incidents in the table: what a decision reads, claims and commits."""
        return JobStates(self.store)

    @functools.cached_property
    def audit(self) -> AuditTrail:
        """The jobs' audit trails in the table, and their once-only steps."""
        return AuditTrail(self.store)

    @functools.cached_property
    def event_claims(self) -> EventClaims:
        """The events (Slack requests) already handled."""
        return EventClaims(self.store)

    @functools.cached_property
    def alarm_markers(self) -> AlarmMarkers:
        """Which jobs have their alarms in place."""
        return AlarmMarkers(self.store)

    @functools.cached_property
    def pending_posts(self) -> PendingPosts:
        """The Slack messages not delivered yet."""
        return PendingPosts(self.store)

    @functools.cached_property
    def resume_tries(self) -> ResumeTries:
        """The claims on what follows a stop, and the resumes being tried."""
        return ResumeTries(self.store)

    @functools.cached_property
    def progress_watches(self) -> ProgressWatches:
        """The resumed jobs whose progress Slack has not heard yet."""
        return ProgressWatches(self.store)

    @functools.cached_property
    def deployment_id(self) -> str:
        """This deployment's id, carried by the Slack buttons and checked when they are pressed."""
        return deployment_id(self.clients.session.region_name or "", self.store.table)

    def saw_running(self, platform: Platform, job: str, now: float) -> None:
        """This container read the job's facts at `now`: it was running."""
        self._found.pop((platform, job), None)
        self._found[platform, job] = now
        if len(self._found) > FOUND_RUNNING_KEPT:
            del self._found[next(iter(self._found))]

    def found_running(self, platform: Platform, job: str, now: float) -> bool:
        """Whether this container found the job running less than `ALARM_COALESCE_SECONDS` ago: an alarm of it is
        then claimed without reading its facts first (its burst costs a claim an alarm, `decide.handle_alarm`)."""
        seen = self._found.get((platform, job))
        return seen is not None and 0 <= now - seen < ALARM_COALESCE_SECONDS

    def source(self, platform: Platform) -> PlatformAdapter:
        """The platform's adapter (`aws.platforms`): its facts, signals and actions."""
        return adapter(platform, self.clients, self.config, self.store, self.clock, self.documents)


@functools.cache
def runtime() -> Runtime:
    """The container's runtime, created on first use (no AWS call at import time)."""
    return Runtime.from_env()
