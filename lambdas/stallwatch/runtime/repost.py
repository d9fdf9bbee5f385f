"""A post's record in the audit trail, and the Slack messages that failed to post, posted again by the sweeper until
delivered or given up."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.pending_posts import PendingPost
from stallwatch.aws.slack import PostResult, follow_up
from stallwatch.core import contract
from stallwatch.core.config import SWEEPER_TIMEOUT_SECONDS
from stallwatch.runtime.environment import Runtime

MAX_SLACK_ATTEMPTS = 12  # posts of one message, the first included: an hour of Slack outage at 5-minute sweeps
RESENDS_PER_SWEEP = 10  # oldest first; bounds a sweep's time while Slack hangs (5 s timeout, 1 retry per post)
POST_CLAIM_SECONDS = SWEEPER_TIMEOUT_SECONDS  # a claim on a resend outlives the sweeper run that holds it


def record_post(
    rt: Runtime,
    key: str,
    audit_sk: str,
    result: dict[str, Any],
    message: dict[str, Any] | None,
    post: PostResult,
    now: float,
) -> None:
    """Add a post's result (`slack`) to `result` and record it as the audit record's outcome; a message that was
    not delivered is kept for the sweeper to post again. Never raises: what was done is done, only its record
    would be missing."""
    result["slack"] = post.audited()
    if not post.ok:
        metrics.add_metric(name=contract.SLACK_FAILURES, unit=MetricUnit.Count, value=1)
    try:
        if post.ok or message is None:  # delivered, or nothing rendered that could be posted again
            rt.audit.record_outcome(key, audit_sk, result)
        else:
            logger.error("Slack post failed; the sweeper will post it again", extra={"job": key, "detail": post.detail})
            result["slack_attempts"] = [{"at": now, "ok": False, "detail": post.detail}]
            rt.pending_posts.record_unsent(key, audit_sk, result, message, now)
    except Exception:  # the actions happened; only their record in the audit trail is missing
        logger.exception("could not record the outcome", extra={"job": key, "audit": audit_sk, "outcome": result})


class SlackTeller:
    """The runtime's `Teller` (`core.platforms.interface`): a way back's step posted in its thread (`follow_up`) and
    recorded on its audit record, a message that was not delivered kept for the sweeper (`record_post`)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def tell(
        self, key: str, audit_sk: str, text: str, outcome: dict[str, Any], now: float, thread: str | None = None
    ) -> None:
        message = follow_up(text, thread)
        record_post(self.rt, key, audit_sk, outcome, message, post_safely(self.rt, message), now)


def post_safely(rt: Runtime, message: dict[str, Any], replacing: dict[str, str] | None = None) -> PostResult:
    """`notifier.post` (or, `replacing` a message posted before, {"channel", "ts"}, `notifier.update`), with anything
    it raises returned as a failed post."""
    try:
        if replacing is not None:
            return rt.notifier.update(message, replacing["channel"], replacing["ts"])
        return rt.notifier.post(message)
    except Exception as exc:  # a bug in posting: recorded like a failed post, never raised
        logger.exception("Slack post raised")
        return PostResult(ok=False, detail=f"post: {type(exc).__name__}: {exc}")


def resend_pending_posts(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """Post again the Slack messages that failed (kept by `decide`), oldest first, as they were rendered.

    Each attempt is claimed first on the message's pending item (`PendingPosts.claim`), so a duplicated sweeper run
    never posts a message twice; each is added to the audit outcome (`slack`, `slack_attempts`). A delivered
    message's item is removed; after `MAX_SLACK_ATTEMPTS` failed posts in all it is given up, logged at ERROR."""
    return [_resend(rt, post, now) for post in rt.pending_posts.oldest(RESENDS_PER_SWEEP)]


def _resend(rt: Runtime, pending: PendingPost, now: float) -> dict[str, Any]:
    report: dict[str, Any] = {"job": pending.job_key, "audit": pending.audit_sk}
    if not rt.pending_posts.claim(pending, now, POST_CLAIM_SECONDS):
        return report | {"status": "claimed_elsewhere"}
    attempts = pending.attempts + 1
    post = rt.notifier.post(pending.message)
    given_up = not post.ok and attempts >= MAX_SLACK_ATTEMPTS
    slack: dict[str, Any] = post.audited() | {"attempts": attempts}
    if given_up:
        slack["given_up"] = True
    history = [*pending.outcome.get("slack_attempts", []), {"at": now, "ok": post.ok, "detail": post.detail}]
    rt.pending_posts.finish(
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
