"""The end-of-run Slack summary: when a run's last job ends, its goodput (opt-in: `stallwatch:summary=true`, or the
policy's `run_summary`). Claimed once per job (an EC2 job, which restarts under its name: once per start of its
group, `ended_run`), so a duplicated end event posts once."""

from __future__ import annotations

from typing import Any

from stallwatch.aws.goodput import run_spans
from stallwatch.aws.observability import logger
from stallwatch.aws.slack import goodput_message
from stallwatch.aws.store import job_key
from stallwatch.core.goodput import Goodput, measure_goodput, summary_wanted
from stallwatch.core.signals import Platform
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.repost import post_safely, record_post

SUMMARY_SK = "summary"


def post_run_summary(
    rt: Runtime,
    name: str,
    tags: dict[str, str],
    platform: Platform,
    ended_run: float | None = None,
    goodput: Goodput | None = None,
) -> dict[str, Any]:
    """The job `name` ended and no attempt follows it: post its run's goodput, if the run opted in. `ended_run`: what
    tells one end of the job from the next where it restarts under its name (`PlatformAdapter.run_end`: an EC2
    group's latest start); `goodput`: the run's, where it was measured already (`run_goodput`)."""
    if not summary_wanted(tags, rt.config.policy.run_summary):
        return {"status": "off"}
    now = rt.clock()
    key = job_key(platform, name)
    audit = {"at": now, "job": name, "platform": platform.value, "trigger": "job-state", "action": "summary"}
    claim = SUMMARY_SK if ended_run is None else f"{SUMMARY_SK}#{ended_run:017.3f}"
    audit_sk = rt.audit.claim(key, claim, audit, now)
    if audit_sk is None:
        return {"status": "duplicate"}
    try:
        goodput = goodput or measure_goodput(*run_spans(rt.clients, rt.store, name, now, platform=platform))
        message = goodput_message(goodput, rt.job_dashboard_url)
    except Exception as exc:  # the run ended either way; a summary that cannot be measured is recorded, not raised
        logger.exception("run summary failed", extra={"job": name})
        rt.audit.record_outcome(key, audit_sk, {"summary": {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}})
        return {"status": "failed", "detail": str(exc)}
    post = post_safely(rt, message)
    record_post(rt, key, audit_sk, {"goodput": goodput.ratio}, message, post, now)
    return {"status": "posted" if post.ok else "post_failed", "goodput": goodput.ratio}
