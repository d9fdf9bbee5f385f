"""This deployment's subscription filter on a log group it does not own (SageMaker's, shared by every training job of
the account): put where a slot is free, removed only if it is ours, and described for `stallwatch doctor`.

    result = subscribe(clients.logs, Subscription(group, name, pattern, on_log_line_arn))
    result.subscribed, result.detail        # False, "both subscription filter slots are taken: a (→ ...), b (→ ...)"
    unsubscribe(clients.logs, subscription) # our filter deleted; another one, even of the same name, never

A log group holds at most two subscription filters (CloudWatch Logs quotas; PutSubscriptionFilter answers
LimitExceededException for a third). Ours is the one of our name whose destination is our function (`is_ours`), for
putting as for deleting: a filter of our name that sends elsewhere is another's, never overwritten (PutSubscription-
Filter of an existing name replaces it) nor removed. An update that moves our filter to a new function names the old
one (`Subscription.previous`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

SUBSCRIPTION_FILTERS_PER_GROUP = 2  # CloudWatch Logs quotas: "Subscription filters: 2/log group", not adjustable


@dataclass(frozen=True)
class Subscription:
    """A subscription filter as this deployment puts it."""

    group: str
    name: str
    pattern: str
    destination: str  # on_log_line's ARN
    previous: str | None = None  # the destination an update moves our filter from (ours too)


@dataclass(frozen=True)
class Subscribed:
    """Whether our filter is on the group, and what the operator should know."""

    subscribed: bool
    detail: str


def filters(logs: Any, group: str) -> list[dict[str, Any]] | None:
    """The group's subscription filters (at most two: one page); None if the group does not exist."""
    try:
        return logs.describe_subscription_filters(logGroupName=group)["subscriptionFilters"]
    except logs.exceptions.ResourceNotFoundException:
        return None


def is_ours(found: dict[str, Any], subscription: Subscription) -> bool:
    """A filter of our name sending to our function (or to the one an update moves it from)."""
    ours = {subscription.destination, subscription.previous} - {None}
    return found["filterName"] == subscription.name and found.get("destinationArn") in ours


def held_by(found: list[dict[str, Any]]) -> str:
    """The filters holding a group's slots, as the operator finds them (name → destination)."""
    return ", ".join(f"{f['filterName']} (→ {f.get('destinationArn', '?')})" for f in found)


def subscribe(logs: Any, subscription: Subscription) -> Subscribed:
    """Create the group if absent (as SageMaker would, with no retention), then put our filter where it is already
    or a slot is free. Both slots held by other filters, or a filter of our name that is not ours: nothing is
    changed."""
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_group(logGroupName=subscription.group)
    found = filters(logs, subscription.group) or []
    namesakes = [f for f in found if f["filterName"] == subscription.name and not is_ours(f, subscription)]
    if namesakes:
        return Subscribed(False, f"a filter of our name on {subscription.group} is another's: {held_by(namesakes)}")
    others = [f for f in found if f["filterName"] != subscription.name]
    if len(others) >= SUBSCRIPTION_FILTERS_PER_GROUP:
        return Subscribed(False, f"both subscription filter slots of {subscription.group} are taken: {held_by(others)}")
    try:
        logs.put_subscription_filter(
            logGroupName=subscription.group,
            filterName=subscription.name,
            filterPattern=subscription.pattern,
            destinationArn=subscription.destination,
        )
    except logs.exceptions.LimitExceededException:  # a filter took the free slot between the two calls
        found = filters(logs, subscription.group) or []
        return Subscribed(False, f"both subscription filter slots of {subscription.group} are taken: {held_by(found)}")
    return Subscribed(True, f"{subscription.name} on {subscription.group} → {subscription.destination}")


def unsubscribe(logs: Any, subscription: Subscription) -> bool:
    """Delete our filter from the group; True if there was one. A filter of another name or destination stays."""
    if not any(is_ours(f, subscription) for f in filters(logs, subscription.group) or []):
        return False
    try:
        logs.delete_subscription_filter(logGroupName=subscription.group, filterName=subscription.name)
    except logs.exceptions.ResourceNotFoundException:  # deleted meanwhile
        return False
    return True
