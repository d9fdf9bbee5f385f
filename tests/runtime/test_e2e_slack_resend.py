"""End to end on moto: a Slack post that failed is kept and posted again by the sweeper, once, or given up."""

from __future__ import annotations

from typing import Any

from handlers import on_alarm, on_job_state, sweeper
from localrun.moto_world import MINUTE, alarm_event, job_state_event, scheduled_event
from stallwatch.runtime import repost
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, audits, seed_nccl_hang

JOB = "qwen-32b-sft"
SWEEP = 5 * MINUTE


def _stop_while_slack_is_down(rt, world, slack, context) -> dict[str, Any]:
    """A hung enforced job, warned while Slack was up, stopped by the sweeper while Slack answers 500."""
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    slack.status = 500
    rt.clock.advance(6 * MINUTE)
    (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]
    return outcome


def _stop_audit(rt) -> dict[str, Any]:
    return next(a for a in audits(rt, JOB) if a["action"] == "stop")


def test_slack_down_during_a_stop_keeps_the_message_until_the_next_sweep_delivers_it_once(
    rt, world, slack, context
) -> None:
    # Given a job stopped while Slack was down
    outcome = _stop_while_slack_is_down(rt, world, slack, context)
    failed_stop_post = slack.posts[-1]

    # Then the stop happened and the message is pending, with its first attempt recorded
    assert (outcome["action"], outcome["stopped"], outcome["posted"]) == ("stop", True, False)
    assert world.status(JOB) == "Stopping"
    (pending,) = rt.pending_posts.oldest(limit=10)
    assert pending.attempts == 1
    assert pending.message["text"] == failed_stop_post["text"]
    assert [a["ok"] for a in _stop_audit(rt)["outcome"]["slack_attempts"]] == [False]

    # When the job ends (its state item is deleted), Slack comes back and the sweeper runs
    on_job_state.handler(job_state_event(JOB, "Stopped"), context)
    slack.status = 200
    rt.clock.advance(SWEEP)
    summary = sweeper.handler(scheduled_event(), context)

    # Then exactly the original stop message was delivered, once, and the marker is gone
    assert [(r["status"], r["attempts"]) for r in summary["slack_resent"]] == [("delivered", 2)]
    assert len(slack.posts) == 3  # the warning, the stop post Slack failed, the same post delivered
    assert slack.posts[-1] == failed_stop_post
    assert "Stopped stalled job" in failed_stop_post["text"]
    assert rt.pending_posts.oldest(limit=10) == []
    stop_outcome = _stop_audit(rt)["outcome"]
    assert stop_outcome["stop"]["ok"] is True
    assert stop_outcome["slack"] == {"ok": True, "detail": "webhook 200", "attempts": 2}
    assert [a["ok"] for a in stop_outcome["slack_attempts"]] == [False, True]

    # And two more sweeps, at once and later, post nothing more
    assert sweeper.handler(scheduled_event(), context)["slack_resent"] == []
    rt.clock.advance(SWEEP)
    assert sweeper.handler(scheduled_event(), context)["slack_resent"] == []
    assert len(slack.posts) == 3


def test_a_duplicated_sweeper_run_does_not_post_twice(rt, world, slack, context, monkeypatch) -> None:
    # Given a stop message pending after Slack was down, and Slack back
    _stop_while_slack_is_down(rt, world, slack, context)
    slack.status = 200
    rt.clock.advance(SWEEP)
    posts_before = len(slack.posts)

    # When a second sweeper run starts while the first is posting the message
    post = rt.notifier.post
    nested: list[dict[str, Any]] = []

    def post_during_another_sweep(message: dict[str, Any]) -> Any:
        if not nested:
            nested.append(sweeper.handler(scheduled_event(), context))
        return post(message)

    monkeypatch.setattr(rt.notifier, "post", post_during_another_sweep)
    first = sweeper.handler(scheduled_event(), context)

    # Then the second run leaves the message to the first, and it is posted once
    assert [r["status"] for r in nested[0]["slack_resent"]] == ["claimed_elsewhere"]
    assert [r["status"] for r in first["slack_resent"]] == ["delivered"]
    assert len(slack.posts) == posts_before + 1
    assert rt.pending_posts.oldest(limit=10) == []


def test_two_runs_from_the_same_read_claim_one_attempt(rt, world, slack, context) -> None:
    # Given a pending message, read by two sweeper runs
    _stop_while_slack_is_down(rt, world, slack, context)
    (seen_by_a,) = rt.pending_posts.oldest(limit=10)
    (seen_by_b,) = rt.pending_posts.oldest(limit=10)
    now = rt.clock()

    # When both claim the next attempt, Then only the first gets it
    assert rt.pending_posts.claim(seen_by_a, now, repost.POST_CLAIM_SECONDS) is True
    assert rt.pending_posts.claim(seen_by_b, now, repost.POST_CLAIM_SECONDS) is False

    # And a fresh read cannot take it while the claim is held, only after it has run out (its holder died)
    (fresh,) = rt.pending_posts.oldest(limit=10)
    assert rt.pending_posts.claim(fresh, now + 1, repost.POST_CLAIM_SECONDS) is False
    assert rt.pending_posts.claim(fresh, now + repost.POST_CLAIM_SECONDS + 1, repost.POST_CLAIM_SECONDS) is True


def test_slack_down_for_every_attempt_gives_up_and_says_so(rt, world, slack, context, caplog) -> None:
    # Given a stop message whose first post failed
    _stop_while_slack_is_down(rt, world, slack, context)
    posts_before = len(slack.posts)

    # When Slack stays down for every sweep up to the limit
    reports = []
    for _ in range(repost.MAX_SLACK_ATTEMPTS - 1):
        rt.clock.advance(SWEEP)
        (report,) = sweeper.handler(scheduled_event(), context)["slack_resent"]
        reports.append(report)

    # Then each sweep tried once, the last one gave up, logged at ERROR, and the audit record says so
    assert [r["status"] for r in reports] == ["failed"] * (repost.MAX_SLACK_ATTEMPTS - 2) + ["given_up"]
    assert reports[-1]["attempts"] == repost.MAX_SLACK_ATTEMPTS
    assert len(slack.posts) == posts_before + repost.MAX_SLACK_ATTEMPTS - 1
    assert any(r.levelname == "ERROR" and "Slack post given up" in r.getMessage() for r in caplog.records)
    outcome = _stop_audit(rt)["outcome"]
    assert outcome["slack"]["given_up"] is True
    assert outcome["slack"]["attempts"] == repost.MAX_SLACK_ATTEMPTS
    assert len(outcome["slack_attempts"]) == repost.MAX_SLACK_ATTEMPTS
    assert not any(a["ok"] for a in outcome["slack_attempts"])

    # And nothing is left to post: Slack back, the next sweep posts nothing
    assert rt.pending_posts.oldest(limit=10) == []
    slack.status = 200
    rt.clock.advance(SWEEP)
    assert sweeper.handler(scheduled_event(), context)["slack_resent"] == []
    assert len(slack.posts) == posts_before + repost.MAX_SLACK_ATTEMPTS - 1
