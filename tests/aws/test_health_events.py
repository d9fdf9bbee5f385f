"""AWS Health's EventBridge event as the handler reads it: the corpus's real ones (their sources in its README),
AWS's time format, the instances it names, and bad input refused with the field named."""

from __future__ import annotations

import pytest

from stallwatch.aws.events import InvalidEventError, parse_event
from stallwatch.aws.health_events import HealthEvent
from tests.fixtures.health import ISSUE, aws_time, health_event, load


def test_the_corpus_scheduled_change_is_read_as_aws_sent_it() -> None:
    event = parse_event(load(), HealthEvent)
    assert event.detail.scheduled
    assert event.instances() == ["i-12345678"]
    assert event.detail.window() == (1465139409.0, None)  # "Sat, 05 Jun 2016 15:10:09 GMT"
    assert event.detail.description() == "A description of the event will be provided here"


def test_an_ec2_issue_is_not_a_scheduled_change() -> None:
    event = parse_event(load(ISSUE), HealthEvent)
    assert not event.detail.scheduled
    assert event.instances() == ["i-abcd1111"]


def test_the_window_and_the_instances_from_entities_resources_or_arns() -> None:
    raw = health_event("i-0abc12345678def00", start=1_800_000_000, end=1_800_007_200)
    assert parse_event(raw, HealthEvent).detail.window() == (1_800_000_000.0, 1_800_007_200.0)
    raw["detail"]["startTime"] = "2027-01-15T08:00:00Z"  # ISO 8601 is taken too
    assert parse_event(raw, HealthEvent).detail.window()[0] == 1_800_000_000.0
    raw["detail"]["affectedEntities"] = []
    raw["resources"] = ["arn:aws:ec2:us-east-1:123456789012:instance/i-0abc12345678def00", "vol-0123"]
    assert parse_event(raw, HealthEvent).instances() == ["i-0abc12345678def00"]
    assert aws_time(1465139409) == "Sun, 05 Jun 2016 15:10:09 GMT"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("eventArn", "arn:aws:ec2:::instance/i-1"),
        ("eventTypeCode", "AWS:EC2/BAD"),
        ("startTime", "Sat, 99 Foo 2016 15:10:09 GMT"),
        ("eventArn", "arn:aws:health:us-east-1::event/" + "x" * 1600),
    ],
)
def test_bad_input_is_refused_with_the_field_named(field, value) -> None:
    raw = health_event("i-0abc12345678def00", start=1_800_000_000)
    raw["detail"][field] = value
    with pytest.raises(InvalidEventError, match=field):
        parse_event(raw, HealthEvent)
