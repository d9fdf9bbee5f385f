"""The scheduled safety net over every running job: log idleness, missing alarms (on EC2 also alarms that no longer
match the job's running instances), expired snoozes, pending stops,
rechecks the engine asked for, check-ups of jobs not decided for `checkup_minutes`, alarms in ALARM that no decision
followed, decisions a timed-out Lambda left unfinished, Slack messages not delivered yet, the alarms of jobs that
are no longer running, and resumed runs' progress."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import StoredState, job_key
from stallwatch.core import alarms, contract, engine
from stallwatch.core.engine import RUNNING_STATUS
from stallwatch.core.signals import JobFacts, Platform
from stallwatch.runtime.decide import abandoned, decide_and_act
from stallwatch.runtime.environment import ConfigurationError, Runtime
from stallwatch.runtime.provision import delete_job_alarms, describe_alarms, provision_alarms
from stallwatch.runtime.repost import resend_pending_posts
from stallwatch.runtime.resume import report_progress

PUT_METRIC_DATA_LIMIT = 1000  # PutMetricData datapoints per call


def sweep(rt: Runtime) -> dict[str, Any]:
    """The safety net over every running job: log idleness, missing alarms, expired snoozes, pending stops, and
    alarms in ALARM that no decision followed (their on_alarm invocation failed); and Slack messages not delivered
    yet, of running and ended jobs alike."""
    now = rt.clock()
    running = _running_jobs(rt)
    existing = describe_alarms(rt, rt.config.alarm_prefix)
    alarmed_at = _alarmed_at(existing, rt.config.alarm_prefix)
    alarmed_hosts: dict[tuple[Platform, str], set[str | None]] = defaultdict(set)
    for ref in _parse_names([a["AlarmName"] for a in existing], rt.config.alarm_prefix):
        alarmed_hosts[ref.platform, ref.job].add(ref.host)
    provisioned = [
        _provision_isolated(rt, p, name)
        for (p, name), facts in running.items()
        if (p, name) not in alarmed_hosts or _hosts_changed(facts, alarmed_hosts[p, name])
    ]
    retired = sum(_retire_if_ended(rt, p, name) for p, name in set(alarmed_hosts) - set(running))
    published = _publish_log_idle(rt, running, now)
    states = rt.store.load_many([job_key(p, name) for p, name in running])
    checkup_s = rt.config.checkup_minutes * 60
    due = [
        (p, name)
        for p, name in running
        if _needs_decision(states[job_key(p, name)], now, checkup_s)
        or abandoned(states[job_key(p, name)], now)
        or _missed_alarm(states[job_key(p, name)], alarmed_at.get((p, name)))
    ]
    resent = resend_pending_posts(rt, now)  # before this sweep's decisions, so older messages go out first
    outcomes = []
    for platform in Platform:
        names = [name for p, name in due if p is platform]
        if names:
            batch = rt.source(platform).many_job_signals(names, now)
            outcomes += [decide_and_act(s, rt, trigger="sweeper").as_dict() for s in batch.values()]
    progressed = report_progress(rt, now)
    summary = {
        "running": len(running),
        "alarms_provisioned": sum(1 for p in provisioned if p["status"] == "alarms_put"),
        "provisioning_errors": sum(1 for p in provisioned if p["status"] == "error"),
        "orphan_alarms_deleted": retired,
        "log_idle_published": published,
        "redecided": outcomes,
        "slack_resent": resent,
        "resumed_progress": progressed,
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


def _retire_if_ended(rt: Runtime, platform: Platform, name: str) -> int:
    """Alarms of a job not listed as running: deleted by the job's prefix if the platform confirms it is not running
    (or gone); their number. A job that started after the listing keeps its alarms."""
    try:
        if rt.source(platform).facts(name).status == RUNNING_STATUS:
            return 0
    except JobNotFoundError:
        pass
    except Exception:
        logger.exception("could not check a job with alarms", extra={"job": name, "platform": platform.value})
        metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
        return 0
    return delete_job_alarms(rt, platform, name)


def _running_jobs(rt: Runtime) -> dict[tuple[Platform, str], JobFacts | None]:
    """Every running job; EC2 jobs with their facts (one DescribeInstances lists and groups them all)."""
    jobs: dict[tuple[Platform, str], JobFacts | None] = {}
    if rt.config.policy.monitor_sagemaker:
        pages = rt.clients.sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals="InProgress")
        jobs |= {
            (Platform.SAGEMAKER, j["TrainingJobName"]): None for page in pages for j in page["TrainingJobSummaries"]
        }
    if rt.config.policy.monitor_ec2:
        jobs |= {(Platform.EC2, name): facts for name, facts in rt.source(Platform.EC2).ec2_jobs().items()}
    return jobs


def _hosts_changed(facts: JobFacts | None, alarmed: set[str | None]) -> bool:
    """An EC2 job whose running instances are not the hosts its alarms watch (a join or leave event was missed)."""
    return facts is not None and set(facts.instance_ids) != alarmed - {None}


def _parse_names(names: Iterable[str], prefix: str) -> list[alarms.AlarmRef]:
    refs = []
    for name in names:
        try:
            refs.append(alarms.parse_alarm_name(name, prefix))
        except ValueError:
            continue  # an alarm that shares the prefix but is not one of ours
    return refs


def _publish_log_idle(rt: Runtime, running: dict[tuple[Platform, str], JobFacts | None], now: float) -> int:
    """Each host's seconds since its last log line, as `LogIdleSeconds` (the log-idle alarms' input)."""
    data = []
    for (platform, job), facts in running.items():
        source = rt.source(platform)
        freshness = source.ec2_log_freshness(facts) if facts is not None else source.log_freshness(job)
        for host, last_t in freshness.items():
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


def _needs_decision(stored: StoredState, now: float, checkup_s: float) -> bool:
    """The engine's watchdog rule over the stored state (`engine.sweeper_due`)."""
    return engine.sweeper_due(stored.state, stored.incident is not None, stored.updated_at, now, checkup_s)
