"""A resume's tries: the first when the job is Stopped (`resume.resume_after_stop`), and, after a failure a later try
can fix (capacity, quotas, throttles, 5xx: `core.resume_retry`), one each sweep for up to an hour.

    started = start_attempt(rt, platform, plan)               # its adapter's: CreateTrainingJob, StartInstances
    report = conclude_try(rt, retry, audit_sk, started, now)  # audit, release or remove the tries, tell Slack
    retry_resumes(rt, now)                                    # the sweeper: the tries that are due

Every try is claimed on the resume's `resume-retry` item with its own audit record, so a duplicated or overlapping
sweeper run never tries twice at once; a CreateTrainingJob that went through before its answer was lost is found by
the next try (`aws.platforms.sagemaker.create_training_job`), so a run never gets two jobs. Slack hears the first
failure (with the retry schedule; in bot mode later tries update that message in place), then once more: resumed, or
given up.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.progress_watches import ProgressWatch
from stallwatch.aws.resume_tries import ResumeRetry
from stallwatch.aws.slack import follow_up
from stallwatch.aws.store import job_key
from stallwatch.core import contract
from stallwatch.core import resume as planning
from stallwatch.core import resume_retry as retrying
from stallwatch.core.config import SWEEPER_TIMEOUT_SECONDS
from stallwatch.core.platforms.interface import ResumeResult
from stallwatch.core.resume import ResumePlan
from stallwatch.core.signals import Platform
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.repost import post_safely, record_post
from stallwatch.runtime.run_goodput import run_ended

RETRIES_PER_SWEEP = 10  # the oldest resumes being tried; each try is one CreateTrainingJob or StartInstances call
TRY_HOLD_SECONDS = SWEEPER_TIMEOUT_SECONDS  # a try's hold outlives the Lambda that takes it


def start_attempt(rt: Runtime, platform: Platform, plan: ResumePlan) -> ResumeResult:
    """The planned attempt, started by the platform's adapter (CreateTrainingJob, StartInstances of the EC2 group);
    anything raised is a failure that a later try may not fix."""
    try:
        return rt.source(platform).start_attempt(plan)
    except Exception as exc:  # the API errors are returned; a raise is a bug, recorded like a failure
        logger.exception("resume raised", extra={"resumed_as": plan.name})
        return ResumeResult(ok=False, detail=f"{type(exc).__name__}: {exc}", code=type(exc).__name__)


def retry_resumes(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """Try again the resumes whose next try is due (oldest first, `RETRIES_PER_SWEEP` a sweep)."""
    return [_try_again(rt, retry, now) for retry in rt.resume_tries.oldest(RETRIES_PER_SWEEP) if retry.next_at <= now]


def _try_again(rt: Runtime, retry: ResumeRetry, now: float) -> dict[str, Any]:
    _, platform, name = retry.job_key.split("#", 2)
    tries = retry.tries + 1
    audit = retry.audit | {"at": now, "trigger": "sweeper", "try": tries}  # the first try's record, with its number
    audit_sk = rt.resume_tries.claim_try(retry, audit, now, TRY_HOLD_SECONDS)
    if audit_sk is None:
        return {"job": name, "status": "claimed_elsewhere"}
    started = start_attempt(rt, Platform(platform), retry.plan)
    return conclude_try(rt, retry.with_tries(tries), audit_sk, started, now)


def conclude_try(rt: Runtime, retry: ResumeRetry, audit_sk: str, started: ResumeResult, now: float) -> dict[str, Any]:
    """After try `retry.tries`: record it (audit outcome, and the tries released for the next one or removed),
    count it, and tell Slack the first failure and the end (resumed, or not). Never raises past the record."""
    _, platform, name = retry.job_key.split("#", 2)
    plan, tries = retry.plan, retry.tries
    sweep_s = rt.config.sweeper_minutes * 60
    next_at = None if started.ok or not started.transient else retrying.next_try_at(now, retry.first_at, tries, sweep_s)
    result: dict[str, Any] = {
        "status": "resumed" if started.ok else "retrying" if next_at else "resume_failed",
        "job": name,
        "resumed_as": plan.name,
        "attempt": plan.attempt,
        "tries": tries,
        "resume": {"ok": started.ok, "detail": started.detail, "code": started.code, "transient": started.transient},
    }
    if next_at is not None:
        result["next_try_at"] = next_at
    outcome = {k: v for k, v in result.items() if k in ("resume", "resumed_as", "attempt", "tries", "next_try_at")}
    text = _slack_text(rt, retry, started, next_at, now)
    message = follow_up(text, retry.thread_ts) if text is not None else None
    in_place = retry.post if next_at is not None and tries > 1 else None  # later tries update the first message
    post = post_safely(rt, message, in_place) if message is not None else None
    kept = retry.post or ({"channel": post.channel, "ts": post.ts} if post and post.channel and post.ts else None)
    rt.resume_tries.finish_try(retry, audit_sk, outcome, next_at, kept)
    if started.ok:
        metrics.add_metric(name=contract.JOBS_RESUMED, unit=MetricUnit.Count, value=1)
        if plan.best_step is not None:
            resumed = job_key(platform, plan.name)  # a new job (SageMaker), or the same one started again (EC2)
            rt.progress_watches.watch(ProgressWatch(resumed, plan.best_step, now, retry.thread_ts), now)
    elif next_at is None:
        metrics.add_metric(name=contract.RESUME_FAILURES, unit=MetricUnit.Count, value=1)
        logger.error("resume failed for good", extra={"job": name, "tries": tries, "detail": started.detail})
    else:
        logger.warning("resume failed; the sweeper tries again", extra={"job": name, "tries": tries, **result})
    if post is not None:  # a failed update is not sent again: the next try's update, or the end's post, follows
        record_post(rt, retry.job_key, audit_sk, outcome, None if in_place else message, post, now)
        result["posted"] = post.ok
    if next_at is None and not started.ok and tries > 1:
        result |= _end_of_run(rt, Platform(platform), name)
    return result


def _slack_text(
    rt: Runtime, retry: ResumeRetry, started: ResumeResult, next_at: float | None, now: float
) -> str | None:
    """What Slack hears after a try: the first failure (which later tries update in place, bot mode), and the end."""
    job, plan, tries = retry.job_key.split("#", 2)[2], retry.plan, retry.tries
    if started.ok:
        resumed = planning.resumed_text(job, plan)
        return resumed if tries == 1 else retrying.retried_text(resumed, tries)
    if next_at is not None:
        if tries > 1 and not (retry.post and rt.notifier.can_update()):
            return None
        return retrying.retrying_text(job, plan.name, started.code, rt.config.sweeper_minutes * 60, tries)
    detail = started.detail if started.transient else f"{started.detail} ({retrying.why_not_retried(started.code)})"
    if tries == 1:
        return planning.resume_failed_text(job, plan.name, detail)
    return retrying.gave_up_text(job, plan.name, tries, now - retry.first_at, detail)


def _end_of_run(rt: Runtime, platform: Platform, name: str) -> dict[str, Any]:
    """A run whose resume was given up ends there: its goodput kept, and its summary if it opted in (on_job_state
    held both back)."""
    try:
        source = rt.source(platform)
        facts = source.facts(name)
        return run_ended(rt, name, facts.tags, platform, ended_run=source.run_end(facts))
    except Exception as exc:  # the summary is extra: the give-up is recorded and posted already
        logger.exception("run summary after a given-up resume failed", extra={"job": name})
        return {"summary": {"status": "failed", "detail": str(exc)}}
