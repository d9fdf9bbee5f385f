"""A fatal line's claim on its job (`Store.claim_wake`): one decision for a burst of lines, never a line swallowed by
a decision that began before it."""

from __future__ import annotations

from stallwatch.aws.job_states import StoredState
from stallwatch.aws.store import job_key
from stallwatch.core.decision import JobState
from stallwatch.core.signals import Platform

HOLD = 120.0
KEY = job_key(Platform.SAGEMAKER, "llama-70b")


def test_lines_a_pending_decision_will_see_are_coalesced_and_later_ones_are_not(rt) -> None:
    # Given a line whose decision begins at t0 + 20 (when a read returns it)
    t0 = rt.clock()
    assert rt.states.claim_wake(KEY, t0, since=t0 + 20, start=t0 + 20, hold_seconds=HOLD) == StoredState()

    # When another host's line, seen from the same time, arrives; and then one seen only from t0 + 30
    same = rt.states.claim_wake(KEY, t0 + 1, since=t0 + 20, start=t0 + 20, hold_seconds=HOLD)
    later = rt.states.claim_wake(KEY, t0 + 2, since=t0 + 30, start=t0 + 30, hold_seconds=HOLD)

    # Then the first is coalesced; the second takes the claim over: the pending decision could not see it
    assert same is None
    assert later is not None


def test_a_committed_decision_that_began_after_the_line_covers_it(rt) -> None:
    # Given a decision that began at t0 and was committed, its claim holding for the burst
    t0 = rt.clock()
    rt.states.commit(KEY, StoredState(), StoredState(JobState(warned_at=t0)), {}, t0, hold_until=t0 + HOLD)

    # When lines seen from before t0 arrive, during the hold and after it, Then they are coalesced
    assert rt.states.claim_wake(KEY, t0 + 5, since=t0 - 10, start=t0 + 5, hold_seconds=HOLD) is None
    assert rt.states.claim_wake(KEY, t0 + 500, since=t0 - 10, start=t0 + 500, hold_seconds=HOLD) is None
    # And a line seen only after it began is decided, although the claim still holds (alarms stay coalesced)
    taken = rt.states.claim_wake(KEY, t0 + 30, since=t0 + 30, start=t0 + 30, hold_seconds=HOLD)
    assert taken is not None
    assert taken.state.warned_at == t0
    assert rt.states.claim_decision(KEY, t0 + 40, HOLD) is None


def test_an_alarms_claim_taken_before_the_line_does_not_swallow_it(rt) -> None:
    # Given an alarm's decision in progress since t0
    t0 = rt.clock()
    assert rt.states.claim_decision(KEY, t0, HOLD) is not None

    # When a line seen from t0 + 10 arrives, Then its decision takes the claim; one seen from t0 does not
    assert rt.states.claim_wake(KEY, t0 + 3, since=t0, start=t0 + 3, hold_seconds=HOLD) is None
    assert rt.states.claim_wake(KEY, t0 + 3, since=t0 + 10, start=t0 + 10, hold_seconds=HOLD) is not None


def test_the_look_before_the_claim_agrees_with_it(rt) -> None:
    # Given no state, then an alarm's claim since t0, then a line's decision seen from t0 + 20 committed at t0 + 20
    t0 = rt.clock()
    cases = [(t0 + 3, t0), (t0 + 3, t0 + 10), (t0 + 25, t0 + 10), (t0 + 25, t0 + 30), (t0 + 400, t0 + 10)]
    assert not rt.states.line_seen(KEY, t0, since=t0, hold_seconds=HOLD)  # a job without a state item
    rt.states.claim_decision(KEY, t0, HOLD)
    first = [rt.states.line_seen(KEY, now, since, HOLD) for now, since in cases[:2]]
    rt.states.commit(KEY, StoredState(), StoredState(JobState(warned_at=t0)), {}, t0 + 20, hold_until=t0 + 20 + HOLD)
    then = [rt.states.line_seen(KEY, now, since, HOLD) for now, since in cases[2:]]

    # Then the look coalesces exactly what the claim would: the line the alarm's decision (begun at t0) sees, and
    # lines the committed decision saw; not a line seen only after either began
    assert first == [True, False]
    assert then == [True, False, True]
    for (now, since), seen in zip(cases[2:], then, strict=True):
        assert (rt.states.claim_wake(KEY, now, since, now, HOLD) is None) == seen
