"""The scheduled safety net over every running job: each platform's own view of its running jobs (a Slurm job whose
end event was lost, `runtime.reconcile`), log idleness, missing alarms (on EC2 also alarms that no longer match the
job's running instances), expired snoozes, pending stops, rechecks the engine asked for, check-ups of jobs not
decided for `checkup_minutes`, alarms in ALARM that no decision followed, decisions a timed-out Lambda left
unfinished, Slack messages not delivered yet, the alarms of jobs that are no longer running, resumes that failed for
a reason a later try can fix, resumed runs' progress, the next step of each recovery in place, and the moves off
hosts AWS Health scheduled events for."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.job_states import StoredState
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, contract, engine
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.platforms.interface import PlatformAdapter
from stallwatch.core.signals import JobFacts, JobStatus, Platform
from stallwatch.runtime.decide import abandoned, decide_and_act
from stallwatch.runtime.environment import ConfigurationError, Runtime
from stallwatch.runtime.health import continue_host_moves
from stallwatch.runtime.provision import alarms_in_alarm, delete_job_alarms, describe_alarms, provision_alarms
from stallwatch.runtime.reconcile import reconcile
from stallwatch.runtime.repost import resend_pending_posts
from stallwatch.runtime.resume import report_progress
from stallwatch.runtime.resume_retry import retry_resumes
from stallwatch.runtime.settle import settle_stops
from stallwatch.runtime.way_back import continue_ways_back

PUT_METRIC_DATA_LIMIT = 1000  # PutMetricData datapoints per call
SWEEP_WORKERS = 16  # concurrent per-job work (decisions, provisioning); each worker waits on AWS, not the CPU
# PutMetricAlarm's default quota is 3 a second: a job of 8 hosts is 27 alarms, 9 s. Missing alarms are put after
# the decisions, at most this many per sweep and not past this far into it (the sweeper's timeout is 300 s).
PROVISION_ALARMS_PER_SWEEP = 450
PROVISION_UNTIL_SECONDS = 180
# Listing every alarm (100 a page) finds the alarms of ended jobs whose end event was lost, and EC2 jobs whose
# nodes changed unseen: one sweep an hour does it; the others list only the alarms in ALARM.
ALARM_AUDIT_SECONDS = 3600


def sweep(rt: Runtime) -> dict[str, Any]:
    """The safety net over every running job: log idleness, missing alarms, expired snoozes, pending stops, and
    alarms in ALARM that no decision followed (their on_alarm invocation failed); and Slack messages not delivered
    yet, of running and ended jobs alike.

    Its calls do not grow with the running jobs that need nothing (see docs/lambdas.md, "Scale"): one Logs
    Insights query gives every host's newest log line, DescribeAlarms reads only the alarms in ALARM (every alarm
    once an hour, `ALARM_AUDIT_SECONDS`), and the alarms' markers say which jobs have theirs. Due jobs are decided
    first, concurrently; jobs without alarms are provisioned after, a bounded number per sweep (PutMetricAlarm is
    slow), the rest by the next sweeps."""
    started, now = time.monotonic(), rt.clock()
    reconciled = reconcile(rt, now)  # first: a job its platform no longer runs is not decided
    running = _running_jobs(rt, now)
    keys = {(p, name): job_key(p, name) for p, name in running}
    # Missing alarms come from the markers, not from this listing.
    audit = rt.alarm_markers.claim_audit(now, ALARM_AUDIT_SECONDS)
    existing = describe_alarms(rt, rt.config.alarm_prefix) if audit else alarms_in_alarm(rt)
    alarmed_at = _alarmed_at(existing, rt.config.alarm_prefix)
    alarmed_hosts: dict[tuple[Platform, str], set[str | None]] = defaultdict(set)
    for ref in _parse_names([a["AlarmName"] for a in existing], rt.config.alarm_prefix):
        alarmed_hosts[ref.platform, ref.job].add(ref.host)
    retired = sum(_retire_if_ended(rt, p, name) for p, name in set(alarmed_hosts) - set(running)) if audit else 0
    newest = _newest_log_lines(rt, running, now)
    published = _publish_log_idle(rt, [line for lines in newest.values() for line in lines], now)
    states = rt.states.load_many(list(keys.values()))
    checkup_s = rt.config.checkup_minutes * 60
    due = [
        job
        for job in running
        if _needs_decision(states[keys[job]], now, checkup_s)
        or abandoned(states[keys[job]], now)
        or _missed_alarm(states[keys[job]], alarmed_at.get(job))
    ]
    resent = resend_pending_posts(rt, now)  # before this sweep's decisions, so older messages go out first
    freshness: dict[tuple[Platform, str], dict[str, float]] = defaultdict(dict)
    for platform, lines in newest.items():
        for job, host, t in lines:
            freshness[platform, job][host] = t
    outcomes = _concurrently(lambda job: _decide_isolated(rt, job, now, states[keys[job]], freshness.get(job, {})), due)
    retried = _isolated(lambda: retry_resumes(rt, now), "could not retry the failed resumes")
    moved = _isolated(lambda: continue_host_moves(rt, now), "could not continue the moves off hosts")
    recovered = _isolated(lambda: continue_ways_back(rt, now), "could not continue the ways back")
    settled = _isolated(lambda: settle_stops(rt, now), "could not read the stops' answers")
    progressed = report_progress(rt, now)
    markers = rt.alarm_markers.provisioned(list(keys.values()))
    stopped = {job for job, outcome in zip(due, outcomes, strict=True) if outcome.get("stopped")}
    # A job whose alarms watch other hosts than its running ones (an EC2 job's): re-rendered from its first alarm.
    changed = {
        job
        for job, facts in running.items()
        if audit and job in alarmed_hosts and _hosts_changed(facts, alarmed_hosts[job])
    }
    done = {job: markers[keys[job]].put for job in running if keys[job] in markers and job not in changed}
    missing = [
        job
        for job in running
        if job not in stopped and (job in changed or not (keys[job] in markers and markers[keys[job]].complete))
    ]
    provisioned = _provision_some(rt, missing, done, started)
    summary = {
        "running": len(running),
        "alarms_provisioned": sum(1 for p in provisioned if p["status"] == "alarms_put"),
        "provisioning_errors": sum(1 for p in provisioned if p["status"] == "error"),
        "left_to_provision": len(missing)
        - sum(1 for p in provisioned if p["status"] != "error" and not p.get("alarms_left")),
        "orphan_alarms_deleted": retired,
        "log_idle_published": published,
        "redecided": outcomes,
        "slack_resent": resent,
        "resume_retries": retried,
        "recoveries": recovered,
        "host_moves": moved,
        "stop_answers": settled,
        "reconciled": reconciled,
        "resumed_progress": progressed,
    }
    logger.info("sweep", extra=summary)
    return summary


def _newest_log_lines(
    rt: Runtime, running: dict[tuple[Platform, str], JobFacts | None], now: float
) -> dict[Platform, list[tuple[str, str, float]]]:
    """Each running host's newest log line (job, host, t), per platform, as its adapter reads them (SageMaker: one
    Logs Insights query; EC2: each job's instance-id streams); a read that fails costs its jobs' log idleness this
    sweep, not the sweep (decisions fall back on the last published `LogIdleSeconds` and their own tail)."""
    return {
        source.platform: source.newest_log_lines(
            {job: facts for (p, job), facts in running.items() if p is source.platform}, now
        )
        for source in _watched_sources(rt)
    }


def _concurrently(work: Callable[[Any], dict[str, Any]], items: list[Any]) -> list[dict[str, Any]]:
    """`work` on every item, `SWEEP_WORKERS` at a time (boto3 clients are thread-safe), results in order."""
    if len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=SWEEP_WORKERS, thread_name_prefix="sweep") as pool:
        return list(pool.map(work, items))


def _isolated(work: Callable[[], list[dict[str, Any]]], what: str) -> list[dict[str, Any]]:
    """`work`, whose failure is logged and counted, never the sweep's (the next sweep does it again)."""
    try:
        return work()
    except Exception:
        logger.exception(what)
        metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
        return []


def _decide_isolated(
    rt: Runtime, job: tuple[Platform, str], now: float, read: StoredState, freshness: dict[str, float]
) -> dict[str, Any]:
    """Re-decide one due job from the state the sweep read; one job's failure is logged and counted, never the
    sweep's."""
    platform, name = job
    try:
        signals = rt.source(platform).job_signals(name, now, freshness)
        return decide_and_act(signals, rt, trigger="sweeper", read=read).as_dict()
    except JobNotFoundError as exc:
        return {"job": name, "status": "not_found", "details": {"reason": str(exc)}}
    except Exception as exc:
        logger.exception("could not re-decide", extra={"job": name, "platform": platform.value})
        metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
        return {"job": name, "status": "error", "details": {"reason": str(exc)}}


def _provision_some(
    rt: Runtime, missing: list[tuple[Platform, str]], done: dict[tuple[Platform, str], int], started: float
) -> list[dict[str, Any]]:
    """The alarms of jobs that lack some, in order, up to `PROVISION_ALARMS_PER_SWEEP` alarms and
    `PROVISION_UNTIL_SECONDS` into the sweep (PutMetricAlarm's quota, not the calls' latency, is the bound: one
    after another); a job's remaining alarms and the remaining jobs are the next sweeps'."""
    budget, results = PROVISION_ALARMS_PER_SWEEP, []
    for platform, name in missing:
        if budget <= 0 or time.monotonic() - started > PROVISION_UNTIL_SECONDS:
            break
        results.append(_provision_isolated(rt, platform, name, budget, done.get((platform, name), 0)))
        budget -= results[-1].get("alarms", 0)
    return results


def _provision_isolated(rt: Runtime, platform: Platform, name: str, budget: int, done: int) -> dict[str, Any]:
    """`provision_alarms` for one job of many: whatever it raises (an API error, a bad job's rendering) is logged
    and counted, and the sweep goes on with the other jobs. A configuration error is every job's, and is raised."""
    try:
        return provision_alarms(rt, platform, name, budget=budget, done=done)
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
        if rt.source(platform).facts(name).status is JobStatus.RUNNING:
            return 0
    except JobNotFoundError:
        pass
    except Exception:
        logger.exception("could not check a job with alarms", extra={"job": name, "platform": platform.value})
        metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
        return 0
    return delete_job_alarms(rt, platform, name)


def _watched_sources(rt: Runtime) -> list[PlatformAdapter]:
    """The adapters of the platforms the deployment watches (`platforms.<name>.monitor`), in registry order."""
    return [rt.source(p) for p in DESCRIPTIONS if rt.config.watches(p)]


def _running_jobs(rt: Runtime, now: float) -> dict[tuple[Platform, str], JobFacts | None]:
    """Every running job of the watched platforms, with its facts where one listing gives them (EC2's: one
    DescribeInstances lists and groups them all)."""
    return {
        (source.platform, name): facts
        for source in _watched_sources(rt)
        for name, facts in source.running_jobs(now).items()
    }


def _hosts_changed(facts: JobFacts | None, alarmed: set[str | None]) -> bool:
    """A job whose running hosts (as the sweep's listing gave them: an EC2 job's instances) are not the hosts its
    alarms watch (a join or leave event was missed)."""
    return facts is not None and set(alarms.host_names(facts)) != alarmed - {None}


def _parse_names(names: Iterable[str], prefix: str) -> list[alarms.AlarmRef]:
    refs = []
    for name in names:
        try:
            refs.append(alarms.parse_alarm_name(name, prefix))
        except ValueError:
            continue  # an alarm that shares the prefix but is not one of ours
    return refs


def _publish_log_idle(rt: Runtime, newest: list[tuple[str, str, float]], now: float) -> int:
    """Each running host's seconds since its last log line, as `LogIdleSeconds` (the log-idle alarms' input, and
    the decisions' log freshness)."""
    data = [
        {
            "MetricName": contract.LOG_IDLE_SECONDS,
            "Dimensions": [{"Name": contract.DIM_JOB, "Value": job}, {"Name": contract.DIM_HOST, "Value": host}],
            "Value": max(now - last_t, 0.0),
            "Unit": "Seconds",
            "Timestamp": datetime.fromtimestamp(now, UTC),
        }
        for job, host, last_t in newest
    ]
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
