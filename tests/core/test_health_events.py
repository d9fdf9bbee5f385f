"""AWS Health's scheduled events, as rules: when a planned move is due, the restart budget it spends, what Slack and
`stallwatch status` are told."""

from __future__ import annotations

import pytest

from stallwatch.core import health_events as rules
from stallwatch.core.resume import NoResume

HOUR = 3600.0
START = 1_800_000_000.0  # the window's start


@pytest.mark.parametrize(
    ("now", "checkpoint", "due"),
    [
        (START - 3 * 86_400, START - 3 * 86_400 - 60, None),  # days away: a checkpoint is not the moment yet
        (START - 20 * HOUR, None, None),  # within a day, no checkpoint
        (START - 20 * HOUR, START - 20 * HOUR - 1200, None),  # the last one ended 20 min ago: wait for the next
        (START - 20 * HOUR, START - 20 * HOUR - 180, "a checkpoint ended 3 min ago"),
        (START - 50 * 60, None, "the window is 50 min away"),  # the lead time: whatever the checkpoints
        (START + 600, None, "the window is 0 min away"),  # began already (a late event): at once
    ],
)
def test_a_move_is_made_right_after_a_checkpoint_within_a_day_else_an_hour_before(now, checkpoint, due) -> None:
    assert rules.move_due(START, now, checkpoint) == due


def test_a_move_spends_a_restart_of_the_runs_budget() -> None:
    assert rules.plan_move({}, 0, done=0) == (1, 3)  # the recovery's default budget
    assert rules.plan_move({"stallwatch:resume": "2"}, 0, done=1) == (2, 2)
    spent = rules.plan_move({"stallwatch:resume": "2"}, 0, done=2)
    assert isinstance(spent, NoResume)
    assert spent.reason == "not moved: restart budget spent (2 of 2 restarts)"
    assert isinstance(rules.plan_move({"stallwatch:resume": "0"}, 5, done=0), NoResume)
    assert isinstance(rules.plan_move({"stallwatch:resume": "many"}, 0, done=0), NoResume)


@pytest.mark.parametrize(
    ("code", "impact"),
    [
        ("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", "retirement"),
        ("AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED", "retirement"),
        ("AWS_EC2_INSTANCE_STOP_SCHEDULED", "stop"),
        ("AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED", "reboot"),
        ("AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED", "maintenance"),
        ("AWS_EC2_SOMETHING_NEW", "AWS_EC2_SOMETHING_NEW"),
    ],
)
def test_the_impact_is_read_from_the_events_code(code, impact) -> None:
    assert rules.impact(code) == impact


def _notice(**changes) -> rules.HostNotice:
    base = rules.HostNotice(
        event_arn="arn:aws:health:us-east-1::event/EC2/X/Y",
        code="AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        instance="i-0abc12345678def00",
        host="node7",
        start=START,
        end=START + 2 * HOUR,
        received_at=START - 10 * 86_400,
    )
    return rules.HostNotice(**(vars(base) | changes))


def test_slack_hears_the_instance_the_event_the_window_and_the_checkpoints_age() -> None:
    now = START - 10 * 86_400
    text = rules.notice_text("pc1-42-llm", _notice(), now - 1800, now, "it will not be moved off")
    assert text.startswith(
        ":calendar: `pc1-42-llm`: AWS Health scheduled the retirement of i-0abc12345678def00 (node node7) "
        "(AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED), window 2027-01-15 08:00 UTC to 2027-01-15 10:00 UTC (in 10.0 days)"
    )
    assert "- last checkpoint: 30 min ago (its end line)" in text
    assert "none seen" in rules.notice_text("j", _notice(), None, now, "")


def test_the_status_line_says_where_the_move_is() -> None:
    now = START - 86_400
    planned = _notice(state=rules.PLANNED, move="restart")
    assert rules.status_line(planned, now) == (
        "host event: i-0abc12345678def00 (node node7) AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED, window 2027-01-15 "
        "08:00 UTC to 2027-01-15 10:00 UTC (in 24.0 h); move planned (restart), by 2027-01-15 07:00 UTC at the latest"
    )
    moved = planned.with_state(rules.MOVED, "restarting in place without it")
    assert rules.status_line(moved, now).endswith("; moved off: restarting in place without it")
    assert rules.HostNotice.of_json(moved.as_json()) == moved
