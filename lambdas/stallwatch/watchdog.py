"""What the Lambdas do, behind thin handlers: provision alarms, decide on alarms, sweep.

    rt = runtime()                                   # from the environment, created once per container
    on_job_state(parse_event(raw, JobStateEvent), rt)
    handle_alarm(parse_event(raw, AlarmEvent), rt)
    sweep(rt)

One decision walks: signals (`AwsSignalSource`) -> `engine.decide` -> commit (state at the version read + audit
+ event claim, one DynamoDB transaction) -> stop -> Slack -> outcome in the audit record. Only the winner of the
commit acts, so a duplicated event or two alarms of one job racing never stop twice or post twice; the stop goes
before Slack, and a Slack failure is recorded, never raised: the message is kept, and the sweeper posts it again
(`resend_pending_posts`) until it is delivered or `MAX_SLACK_ATTEMPTS` posts have failed.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stallwatch import actions, alarms, contract, engine
from stallwatch.aws_source import AwsClients, AwsSignalSource, JobNotFoundError
from stallwatch.config import StallwatchConfig
from stallwatch.decision import Action, Decision
from stallwatch.events import AlarmActionEvent, AlarmStateChange, InstanceStateChange, TrainingJobStateChange
from stallwatch.observability import logger, metrics
from stallwatch.policy import EC2_MONITOR_TAG, Mode
from stallwatch.signals import JobSignals, Platform
from stallwatch.slack import AlertMessage, Evidence, PostResult, SlackNotifier
from stallwatch.store import ConcurrentDecisionError, PendingPost, Store, StoredState, job_key

POSTED_ACTIONS = frozenset({Action.ALERT, Action.WARN, Action.STOP})
ENDED_SAGEMAKER = frozenset({"Completed", "Failed", "Stopped"})
ENDED_EC2 = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
DELETE_ALARMS_LIMIT = 100  # DeleteAlarms names per call
PUT_METRIC_DATA_LIMIT = 1000  # PutMetricData datapoints per call
MONITOR_TAG_VALUE = "true"
MAX_SLACK_ATTEMPTS = 12  # posts of one message, the first included: an hour of Slack outage at 5-minute sweeps
RESENDS_PER_SWEEP = 10  # oldest first; bounds a sweep's time while Slack hangs (5 s timeout, 1 retry per post)
POST_CLAIM_SECONDS = 300  # the sweeper's Lambda timeout: a claim on a resend outlives the run that holds it


class LambdaEnvironment(BaseModel):
    """The functions' environment variables."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=3)
    slack_secret_arn: str | None = Field(None, alias="SLACK_SECRET_ARN")
    alarm_action_arn: str = Field("", alias="ALARM_ACTION_ARN")


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

    @classmethod
    def from_env(cls) -> Runtime:
        try:
            env = LambdaEnvironment.model_validate(dict(os.environ))
            config = StallwatchConfig.from_env()
        except ValidationError as exc:
            raise ConfigurationError(f"invalid Lambda environment: {exc}") from exc
        clients = AwsClients()
        return cls(
            config=config,
            clients=clients,
            store=Store(clients.dynamodb, env.table_name, config.incident_ttl_days),
            notifier=SlackNotifier(clients.secretsmanager, env.slack_secret_arn or config.slack.secret_arn),
            alarm_action_arn=env.alarm_action_arn,
        )

    def source(self, platform: Platform) -> AwsSignalSource:
        return AwsSignalSource(self.clients, platform, self.config.policy)


@functools.cache
def runtime() -> Runtime:
    """The container's runtime, created on first use (no AWS call at import time)."""
    return Runtime.from_env()


@dataclass
class Outcome:
    """What one decision did: the handler's return value, and logged with the audit record."""

    job: str
    status: str  # decided, duplicate, ignored, off, not_found
    diagnosis: str | None = None
    action: str | None = None
    stopped: bool | None = None
    posted: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}


# ---- on_alarm ---------------------------------------------------------------------------------------------------


def handle_alarm(event: AlarmActionEvent | AlarmStateChange, rt: Runtime) -> dict[str, Any]:
    """An alarm fired: look at its job and act on what the engine decides."""
    alarm = event.alarm
    if alarm.state.value != "ALARM":
        return Outcome(job="", status="ignored", details={"reason": f"alarm state {alarm.state.value}"}).as_dict()
    try:
        ref = alarms.parse_alarm_name(alarm.alarm_name, rt.config.alarm_prefix)
    except ValueError as exc:
        logger.warning("ignoring an alarm Stallwatch did not create", extra={"error": str(exc)})
        return Outcome(job="", status="ignored", details={"reason": str(exc)}).as_dict()
    source = rt.source(ref.platform)
    now = rt.clock()
    try:
        signals = source.job_signals(ref.job, now)
    except JobNotFoundError as exc:
        return Outcome(job=ref.job, status="not_found", details={"reason": str(exc)}).as_dict()
    outcome = decide_and_act(signals, rt, trigger=alarm.alarm_name, event_key=alarm.dedup_key)
    return outcome.as_dict()


def decide_and_act(signals: JobSignals, rt: Runtime, trigger: str, event_key: str | None = None) -> Outcome:
    """Decide on one job and, if this invocation wins the commit, stop and/or alert."""
    facts = signals.facts
    effective = rt.config.policy.for_job(facts.tags)
    if effective.mode is Mode.OFF:
        return Outcome(job=facts.name, status="off")
    key = job_key(facts.platform, facts.name)
    read = rt.store.load(key)
    decision = engine.decide(signals, effective, read.state, signals.now)
    written, close = _next_stored(read, decision)
    audit = {
        "at": decision.at,
        "job": facts.name,
        "platform": facts.platform.value,
        "trigger": trigger,
        "event": event_key,
        "mode": decision.mode.value,
        "diagnosis": decision.diagnosis.value,
        "action": decision.action.value,
        "would": decision.would.value,
        "reasons": list(decision.reasons),
        "evidence": decision.evidence,
        "may_stop": effective.may_stop,
        "tag_errors": effective.tag_errors,
    }
    try:
        audit_sk = rt.store.commit(key, read, written, audit, signals.now, event_key=event_key, close_incident=close)
    except ConcurrentDecisionError as exc:
        logger.info("decision not committed: duplicate event or concurrent decision", extra={"error": str(exc)})
        metrics.add_metric(name=contract.DUPLICATE_DECISIONS, unit=MetricUnit.Count, value=1)
        return Outcome(job=facts.name, status="duplicate", details={"reason": str(exc)})
    metrics.add_metric(name=contract.DECISIONS, unit=MetricUnit.Count, value=1)
    outcome = Outcome(
        job=facts.name, status="decided", diagnosis=decision.diagnosis.value, action=decision.action.value
    )
    _act(signals, rt, decision, written, key, audit_sk, outcome)
    logger.info("decision", extra={"audit": audit, "outcome": outcome.as_dict()})
    return outcome


def _next_stored(read: StoredState, decision: Decision) -> tuple[StoredState, str | None]:
    """The state to write, and the incident to close (if the job is no longer a problem)."""
    state = engine.next_state(read.state, decision)
    if decision.diagnosis in engine.NOT_PROBLEMS:
        return StoredState(state, read.version, None), read.incident
    incident = read.incident or f"incident#{decision.at:017.3f}"
    return StoredState(state, read.version, incident), None


def _act(
    signals: JobSignals,
    rt: Runtime,
    decision: Decision,
    written: StoredState,
    key: str,
    audit_sk: str,
    outcome: Outcome,
) -> None:
    """Stop first, then Slack; record both results. Never raises: the decision is committed (and its event claimed)
    already, so a raise would turn Lambda's retry into a duplicate and lose the action. A stop that fails or raises
    is released for the sweeper to retry; a message that rendered but was not delivered is kept for the sweeper to
    post again.

    The engine repeats no action (`JobState.alerted`, `warned_at`, `stopped_at`), so each one happens once."""
    if decision.action not in POSTED_ACTIONS:
        return
    job = signals.facts.name
    result: dict[str, Any] = {}
    stop_result = _stop(rt, signals, written, key) if decision.action is Action.STOP else None
    if stop_result is not None:
        outcome.stopped = stop_result.ok
        result["stop"] = {"ok": stop_result.ok, "detail": stop_result.detail}
    message: dict[str, Any] | None = None
    try:
        evidence = Evidence.of(decision, signals, written.state.stall_since)
        message = AlertMessage(decision, signals.facts, evidence, stop_result, written.incident).render()
        post = rt.notifier.post(message)
    except Exception as exc:  # a bug in rendering or posting: recorded like a failed post, never raised
        step = "post" if message is not None else "render"
        logger.exception("Slack message failed to render or post", extra={"job": job, "step": step})
        post = PostResult(ok=False, detail=f"{step}: {type(exc).__name__}: {exc}")
    outcome.posted = post.ok
    result["slack"] = {"ok": post.ok, "detail": post.detail}
    outcome.details.update(result)
    if not post.ok:
        metrics.add_metric(name=contract.SLACK_FAILURES, unit=MetricUnit.Count, value=1)
    try:
        if post.ok or message is None:  # delivered, or nothing rendered that could be posted again
            rt.store.record_outcome(key, audit_sk, result)
        else:
            logger.error("Slack post failed; the sweeper will post it again", extra={"job": job, "detail": post.detail})
            result["slack_attempts"] = [{"at": signals.now, "ok": False, "detail": post.detail}]
            rt.store.record_unsent_post(key, audit_sk, result, message, signals.now)
    except Exception:  # the actions happened; only their record in the audit trail is missing
        logger.exception("could not record the outcome", extra={"job": job, "audit": audit_sk, "outcome": result})


def _stop(rt: Runtime, signals: JobSignals, written: StoredState, key: str) -> actions.StopResult:
    """`actions.stop`, with any failure (returned or raised) counted, logged, and released for the sweeper to retry."""
    job = signals.facts.name
    try:
        stopped = actions.stop(rt.clients, signals.facts)
    except Exception as exc:  # actions.stop returns API errors; anything raised is a bug, treated as a failed stop
        logger.exception("stop raised; the sweeper will retry", extra={"job": job})
        stopped = actions.StopResult(ok=False, detail=f"{type(exc).__name__}: {exc}")
    metrics.add_metric(
        name=contract.JOBS_STOPPED if stopped.ok else contract.STOP_FAILURES, unit=MetricUnit.Count, value=1
    )
    if stopped.ok:
        return stopped
    logger.error("stop failed; the sweeper will retry", extra={"job": job, "detail": stopped.detail})
    try:
        # `written` carries the version read; the commit wrote the next one
        rt.store.release_stop(key, written.state, version=written.version + 1)
    except Exception:  # the stop stays recorded as done: an operator must stop the job
        logger.exception("could not release the failed stop: the sweeper will not retry it", extra={"job": job})
    return stopped


def resend_pending_posts(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """Post again the Slack messages that failed (kept by `_act`), oldest first, as they were rendered.

    Each attempt is claimed first on the message's pending item (`Store.claim_post`), so a duplicated sweeper run
    never posts a message twice; each is added to the audit outcome (`slack`, `slack_attempts`). A delivered
    message's item is removed; after `MAX_SLACK_ATTEMPTS` failed posts in all it is given up, logged at ERROR."""
    return [_resend(rt, post, now) for post in rt.store.pending_posts(RESENDS_PER_SWEEP)]


def _resend(rt: Runtime, pending: PendingPost, now: float) -> dict[str, Any]:
    report: dict[str, Any] = {"job": pending.job_key, "audit": pending.audit_sk}
    if not rt.store.claim_post(pending, now, POST_CLAIM_SECONDS):
        return report | {"status": "claimed_elsewhere"}
    attempts = pending.attempts + 1
    post = rt.notifier.post(pending.message)
    given_up = not post.ok and attempts >= MAX_SLACK_ATTEMPTS
    slack: dict[str, Any] = {"ok": post.ok, "detail": post.detail, "attempts": attempts}
    if given_up:
        slack["given_up"] = True
    history = [*pending.outcome.get("slack_attempts", []), {"at": now, "ok": post.ok, "detail": post.detail}]
    rt.store.finish_post(
        pending, pending.outcome | {"slack": slack, "slack_attempts": history}, keep=not post.ok and not given_up
    )
    report |= {"status": "delivered" if post.ok else "given_up" if given_up else "failed", "attempts": attempts}
    if not post.ok:
        metrics.add_metric(name=contract.SLACK_FAILURES, unit=MetricUnit.Count, value=1)
        if given_up:
            metrics.add_metric(name=contract.SLACK_POSTS_GIVEN_UP, unit=MetricUnit.Count, value=1)
        log = logger.error if given_up else logger.warning
        log("Slack post given up" if given_up else "Slack post failed again", extra=report | {"detail": post.detail})
    return report


# ---- on_job_state -----------------------------------------------------------------------------------------------


def on_job_state(event: TrainingJobStateChange | InstanceStateChange, rt: Runtime) -> dict[str, Any]:
    """A job started or ended: create or delete its alarms; an ended job's incident is closed."""
    if isinstance(event, TrainingJobStateChange):
        if not rt.config.policy.monitor_sagemaker:
            return {"status": "ignored", "reason": "monitor_sagemaker is false"}
        detail = event.detail
        name, platform = detail.training_job_name, Platform.SAGEMAKER
        if detail.training_job_status == "InProgress":
            return provision_alarms(rt, platform, name)
        if detail.training_job_status in ENDED_SAGEMAKER:
            return retire_job(rt, platform, name, detail.training_job_status)
        return {"status": "ignored", "job": name, "reason": f"status {detail.training_job_status}"}
    if not rt.config.policy.monitor_ec2:
        return {"status": "ignored", "reason": "monitor_ec2 is false"}
    instance, state = event.detail.instance_id, event.detail.state
    if state == "running":
        return provision_alarms(rt, Platform.EC2, instance)
    if state in ENDED_EC2:
        return retire_job(rt, Platform.EC2, instance, state)
    return {"status": "ignored", "job": instance, "reason": f"state {state}"}


def provision_alarms(rt: Runtime, platform: Platform, name: str) -> dict[str, Any]:
    """Put the job's alarms as the policy (after its tags) renders them; none for mode off or unmonitored EC2."""
    try:
        facts = rt.source(platform).facts(name)
    except JobNotFoundError as exc:
        return {"status": "not_found", "job": name, "reason": str(exc)}
    if platform is Platform.EC2 and not _monitored_instance(facts.tags):
        return {"status": "ignored", "job": name, "reason": f"not tagged {EC2_MONITOR_TAG}={MONITOR_TAG_VALUE}"}
    effective = rt.config.policy.for_job(facts.tags)
    if effective.tag_errors:
        logger.warning("ignored bad stallwatch tags", extra={"job": name, "errors": effective.tag_errors})
    if not rt.alarm_action_arn:
        raise ConfigurationError("ALARM_ACTION_ARN is not set: the alarms' action is the on_alarm function")
    definitions = alarms.render_alarms(facts, effective, rt.config.alarm_prefix, [rt.alarm_action_arn])
    if not definitions:
        deleted = _delete_alarms(rt, platform, name)
        return {"status": "off", "job": name, "alarms_deleted": deleted}
    for definition in definitions:
        rt.clients.cloudwatch.put_metric_alarm(**definition)
    metrics.add_metric(name=contract.ALARMS_PUT, unit=MetricUnit.Count, value=len(definitions))
    return {"status": "alarms_put", "job": name, "alarms": len(definitions), "tag_errors": effective.tag_errors}


def retire_job(rt: Runtime, platform: Platform, name: str, reason: str) -> dict[str, Any]:
    """The job ended: delete its alarms and close its open incident."""
    deleted = _delete_alarms(rt, platform, name)
    closed = rt.store.close_job(job_key(platform, name), f"job {reason}", rt.clock())
    return {"status": "retired", "job": name, "alarms_deleted": deleted, "incident_closed": closed}


def _describe_alarms(rt: Runtime, prefix: str) -> list[dict[str, Any]]:
    paginator = rt.clients.cloudwatch.get_paginator("describe_alarms")
    pages = paginator.paginate(AlarmNamePrefix=prefix, AlarmTypes=["MetricAlarm"])
    return [a for page in pages for a in page["MetricAlarms"]]


def _alarm_names(rt: Runtime, prefix: str) -> list[str]:
    return [a["AlarmName"] for a in _describe_alarms(rt, prefix)]


def _delete_alarms(rt: Runtime, platform: Platform, name: str) -> int:
    names = _alarm_names(rt, alarms.job_alarm_prefix(rt.config.alarm_prefix, platform, name))
    for offset in range(0, len(names), DELETE_ALARMS_LIMIT):
        rt.clients.cloudwatch.delete_alarms(AlarmNames=names[offset : offset + DELETE_ALARMS_LIMIT])
    return len(names)


# ---- sweeper ----------------------------------------------------------------------------------------------------


def sweep(rt: Runtime) -> dict[str, Any]:
    """The safety net over every running job: log idleness, missing alarms, expired snoozes, pending stops, and
    alarms in ALARM that no decision followed (their on_alarm invocation failed); and Slack messages not delivered
    yet, of running and ended jobs alike."""
    now = rt.clock()
    running = _running_jobs(rt)
    existing = _describe_alarms(rt, rt.config.alarm_prefix)
    alarmed_at = _alarmed_at(existing, rt.config.alarm_prefix)
    with_alarms = {
        (r.platform, r.job) for r in _parse_names([a["AlarmName"] for a in existing], rt.config.alarm_prefix)
    }
    provisioned = [_provision_isolated(rt, p, name) for p, name in running if (p, name) not in with_alarms]
    published = _publish_log_idle(rt, [name for p, name in running if p is Platform.SAGEMAKER], now)
    states = rt.store.load_many([job_key(p, name) for p, name in running])
    due = [
        (p, name)
        for p, name in running
        if _needs_decision(states[job_key(p, name)], now)
        or _missed_alarm(states[job_key(p, name)], alarmed_at.get((p, name)))
    ]
    resent = resend_pending_posts(rt, now)  # before this sweep's decisions, so older messages go out first
    outcomes = []
    for platform in Platform:
        names = [name for p, name in due if p is platform]
        if names:
            batch = rt.source(platform).many_job_signals(names, now)
            outcomes += [decide_and_act(s, rt, trigger="sweeper").as_dict() for s in batch.values()]
    summary = {
        "running": len(running),
        "alarms_provisioned": sum(1 for p in provisioned if p["status"] == "alarms_put"),
        "provisioning_errors": sum(1 for p in provisioned if p["status"] == "error"),
        "log_idle_published": published,
        "redecided": outcomes,
        "slack_resent": resent,
    }
    logger.info("sweep", extra=summary)
    return summary


def _provision_isolated(rt: Runtime, platform: Platform, name: str) -> dict[str, Any]:
    """`provision_alarms` for one job of many: whatever it raises (an API error, a bad job's rendering) is logged
    and counted, and the sweep goes on with the other jobs. A configuration error is every job's, and is raised."""
    try:
        return provision_alarms(rt, platform, name)
    except ConfigurationError:
        raise
    except Exception as exc:
        logger.exception("could not provision alarms", extra={"job": name, "platform": platform.value})
        metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
        return {"status": "error", "job": name, "reason": str(exc)}


def _running_jobs(rt: Runtime) -> list[tuple[Platform, str]]:
    jobs: list[tuple[Platform, str]] = []
    if rt.config.policy.monitor_sagemaker:
        pages = rt.clients.sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals="InProgress")
        jobs += [(Platform.SAGEMAKER, j["TrainingJobName"]) for page in pages for j in page["TrainingJobSummaries"]]
    if rt.config.policy.monitor_ec2:
        # EC2 filters match tag values exactly: filter on the key, and match the value as `provision_alarms` does
        filters = [
            {"Name": "tag-key", "Values": [EC2_MONITOR_TAG]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
        pages = rt.clients.ec2.get_paginator("describe_instances").paginate(Filters=filters)
        jobs += [
            (Platform.EC2, i["InstanceId"])
            for page in pages
            for r in page["Reservations"]
            for i in r["Instances"]
            if _monitored_instance({t["Key"]: t["Value"] for t in i.get("Tags", [])})
        ]
    return jobs


def _monitored_instance(tags: dict[str, str]) -> bool:
    """An EC2 instance is watched when tagged `stallwatch:monitor=true`, in any case (`True`, `TRUE`)."""
    return tags.get(EC2_MONITOR_TAG, "").strip().lower() == MONITOR_TAG_VALUE


def _parse_names(names: Iterable[str], prefix: str) -> list[alarms.AlarmRef]:
    refs = []
    for name in names:
        try:
            refs.append(alarms.parse_alarm_name(name, prefix))
        except ValueError:
            continue  # an alarm that shares the prefix but is not one of ours
    return refs


def _publish_log_idle(rt: Runtime, jobs: list[str], now: float) -> int:
    """Each host's seconds since its last log line, as `LogIdleSeconds` (the log-idle alarms' input)."""
    source = rt.source(Platform.SAGEMAKER)
    data = []
    for job in jobs:
        for host, last_t in source.log_freshness(job).items():
            dims = [{"Name": contract.DIM_JOB, "Value": job}, {"Name": contract.DIM_HOST, "Value": host}]
            data.append(
                {
                    "MetricName": contract.LOG_IDLE_SECONDS,
                    "Dimensions": dims,
                    "Value": max(now - last_t, 0.0),
                    "Unit": "Seconds",
                    "Timestamp": datetime.fromtimestamp(now, UTC),
                }
            )
    for offset in range(0, len(data), PUT_METRIC_DATA_LIMIT):
        rt.clients.cloudwatch.put_metric_data(
            Namespace=contract.NAMESPACE, MetricData=data[offset : offset + PUT_METRIC_DATA_LIMIT]
        )
    return len(data)


def _alarmed_at(described: list[dict[str, Any]], prefix: str) -> dict[tuple[Platform, str], float]:
    """Per job, when the newest of its alarms now in ALARM got there."""
    latest: dict[tuple[Platform, str], float] = {}
    for alarm in described:
        if alarm["StateValue"] != "ALARM":
            continue
        for ref in _parse_names([alarm["AlarmName"]], prefix):
            t = alarm["StateUpdatedTimestamp"].timestamp()
            latest[ref.platform, ref.job] = max(latest.get((ref.platform, ref.job), t), t)
    return latest


def _missed_alarm(stored: StoredState, alarmed_at: float | None) -> bool:
    """An alarm went to ALARM after the job's last decision: its on_alarm invocation never decided."""
    return alarmed_at is not None and (stored.updated_at is None or stored.updated_at < alarmed_at)


def _needs_decision(stored: StoredState, now: float) -> bool:
    """An open incident, a warning waiting to become a stop, or a snooze that has run out."""
    state = stored.state
    snooze_expired = state.snoozed_until is not None and state.snoozed_until <= now
    return stored.incident is not None or state.warned_at is not None or snooze_expired
