"""After Stallwatch's stop: resume the run from its checkpoint, and tell Slack when it has made up the lost ground.

    resume_after_stop(rt, facts.platform, "llama-pretrain")       # on_job_state, once the job is Stopped
    report_progress(rt, now)                                       # the sweeper: resumed jobs past their best step

Only a run that opted in (`stallwatch:resume=<max restarts>`) and was stopped by Stallwatch itself for a hang or a
crashed rank is resumed (`core.resume` decides). What follows one stop is claimed in the store with its audit record,
so a duplicated Stopped event resumes once; the Slack follow-up goes in the stop message's thread (bot mode). A resume
that fails for a reason a later try can fix is tried again by the sweeper (`resume_retry`).
"""

from __future__ import annotations

import functools
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.resume_tries import ResumeRetry
from stallwatch.aws.slack import follow_up
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core import contract
from stallwatch.core import resume as planning
from stallwatch.core.resume import NoResume, StopRecord
from stallwatch.core.signals import JobStatus, Platform, Series
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.repost import post_safely, record_post
from stallwatch.runtime.resume_retry import TRY_HOLD_SECONDS, conclude_try, start_attempt
from stallwatch.runtime.way_back import attempts_so_far

PROGRESS_WATCHES_PER_SWEEP = 20
AUDIT_TRIGGER = "job-state"


def resume_after_stop(rt: Runtime, platform: Platform, name: str) -> dict[str, Any]:
    """The job is Stopped: start its next attempt if the run opted in and Stallwatch stopped it for a stall a restart
    fixes; alert when it opted in and cannot be resumed. Claimed once per stop."""
    key = job_key(platform, name)
    stops = rt.audit.stops(key)
    stop = stops[-1] if stops else None
    if stop is None:  # the common case (a job's own end, a human's stop) costs one query, no platform call
        return {"status": "not_resumed", "job": name, "reason": planning.NOT_STOPPED_BY_STALLWATCH.reason}
    now = rt.clock()
    audit: dict[str, Any] = {"at": now, "job": name, "platform": platform.value, "trigger": AUDIT_TRIGGER}
    history = functools.partial(attempts_so_far, rt, key)
    planned = rt.source(platform).plan_resume(name, stop, rt.config.policy.resume_max_restarts, history)
    verdict = planned.plan
    audit |= planned.audit
    if isinstance(verdict, NoResume) and not verdict.alert:
        return {"status": "not_resumed", "job": name, "reason": verdict.reason}
    if isinstance(verdict, NoResume):
        audit |= {"action": "no_resume", "reasons": [verdict.reason]}
        tries = None
    else:
        audit |= {"action": planning.RESUME_ACTION, "resumed_as": verdict.name, "attempt": verdict.attempt}
        repeated = {k: v for k, v in audit.items() if k not in ("at", "trigger")}  # every try's audit record has them
        tries = ResumeRetry(key, stop.at, verdict, first_at=now, audit=repeated, thread_ts=stop.slack_ts, next_at=now)
    audit_sk = rt.resume_tries.claim(key, stop.at, audit, now, tries, hold_until=now + TRY_HOLD_SECONDS)
    if audit_sk is None:
        logger.info("resume already claimed: a duplicated event", extra={"job": name})
        return {"status": "duplicate", "job": name}
    if tries is None:
        assert isinstance(verdict, NoResume)
        return _tell(rt, key, audit_sk, planning.not_resumed_text(name, verdict), stop, {"status": "gave_up"}, now)
    started = start_attempt(rt, platform, tries.plan)
    return conclude_try(rt, tries, audit_sk, started, now)


def _tell(
    rt: Runtime,
    key: str,
    audit_sk: str,
    text: str,
    stop: StopRecord,
    result: dict[str, Any],
    now: float,
) -> dict[str, Any]:
    """Post `text` in the stop message's thread and record the outcome; never raises."""
    message = follow_up(text, stop.slack_ts)
    post = post_safely(rt, message)
    outcome = {k: v for k, v in result.items() if k in ("resume", "resumed_as", "attempt")}
    record_post(rt, key, audit_sk, outcome, message, post, now)
    return result | {"posted": post.ok}


def report_progress(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """Resumed jobs that passed the step their run had reached: Slack hears how long after the restart (once).
    A watched job that ended first is dropped (its own stop says why)."""
    reports = []
    for watch in rt.progress_watches.oldest(PROGRESS_WATCHES_PER_SWEEP):
        _, platform, name = watch.job_key.split("#", 2)
        try:
            signals = rt.source(Platform(platform)).job_signals(name, now)
        except JobNotFoundError:
            rt.progress_watches.end(watch, None, now)
            reports.append({"job": name, "status": "not_found"})
            continue
        except Exception:  # one job's read failing must not end the sweep; the next sweep looks again
            logger.exception("could not read a resumed job's progress", extra={"job": name})
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
            continue
        steps = signals.agent.get("Step", Series()).points
        passed = [(t, step) for t, step in steps if step > watch.best_step]
        if not passed:
            if signals.facts.status is not JobStatus.RUNNING:
                rt.progress_watches.end(watch, None, now)
                reports.append({"job": name, "status": "ended"})
            continue
        t, step = passed[0]
        audit = {"at": now, "job": name, "trigger": "sweeper", "action": "progress", "step": step, "reached_at": t}
        audit_sk = rt.progress_watches.end(watch, audit, now)
        if audit_sk is None:
            continue  # another sweep reported it
        message = follow_up(planning.progress_text(name, step, t - watch.restarted_at), watch.thread_ts)
        post = post_safely(rt, message)
        record_post(rt, watch.job_key, audit_sk, {"step": step}, message, post, now)
        reports.append({"job": name, "status": "progressed", "step": step, "posted": post.ok})
    return reports
