"""The custom resource `Custom::FatalLineSubscription`: this deployment's subscription filter on SageMaker's log group,
which every training job of the account shares, which may not exist yet in a fresh account, and whose two filter
slots may be taken. (An `AWS::Logs::SubscriptionFilter` would fail the deploy in either case.)

    handle_request(raw_event, clients)   # answers CloudFormation (the request's ResponseURL), never raises

Create and Update: the group is created if absent and our filter put where a slot is free (`aws.log_subscriptions`);
a filter of our name that sends elsewhere is another's, and left as it is (the deploy goes on, not subscribed).
Both slots held by other filters is no failure: the deploy goes on without the wake-up on SageMaker (the alarms, the
rechecks and the sweeper still decide), the resource's `Subscribed` says false and why, and `stallwatch doctor`
reports it with what to do. Delete: our filter (our name and our destination) is removed, never another. An
unreadable request or an AWS error fails the resource, with the reason.
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.cloudformation import CustomResourceAnswer, answer
from stallwatch.aws.events import InvalidEventError, SubscriptionRequest, parse_event
from stallwatch.aws.log_subscriptions import Subscription, subscribe, unsubscribe
from stallwatch.aws.observability import logger


def handle_request(raw: Any, clients: AwsClients) -> dict[str, Any]:
    """Do what CloudFormation asks and answer it; the answer, as sent."""
    try:
        request = parse_event(raw, SubscriptionRequest)
    except InvalidEventError as exc:
        return _answer_unreadable(raw, str(exc))
    props = request.resource_properties
    subscription = Subscription(
        props.log_group_name,
        props.filter_name,
        props.filter_pattern,
        props.destination_arn,
        request.previous_destination,
    )
    # Deleted: the resource CloudFormation names; else ours: an Update to another group or name is a new resource
    physical_id = request.physical_resource_id if request.request_type == "Delete" else None
    physical_id = physical_id or f"{subscription.group}:{subscription.name}"
    status, reason, data = "SUCCESS", "", {}
    try:
        if request.request_type == "Delete":
            # an Update that named another group or filter is followed by the Delete of the old one: only ours goes
            removed = unsubscribe(clients.logs, subscription)
            data = {"Subscribed": "false", "Detail": "removed" if removed else "no filter of ours was there"}
        else:
            result = subscribe(clients.logs, subscription)
            data = {"Subscribed": str(result.subscribed).lower(), "Detail": result.detail}
            if not result.subscribed:
                logger.warning("not subscribed", extra={"detail": result.detail})
    except Exception as exc:  # an AWS error or a bug: the resource fails with it, CloudFormation is never left waiting
        logger.exception("custom resource failed", extra={"request": request.request_type})
        status, reason = "FAILED", f"{type(exc).__name__}: {exc}"
    reply = CustomResourceAnswer(
        status,
        physical_id,
        request.stack_id,
        request.request_id,
        request.logical_resource_id,
        reason=reason,
        data=data,
    )
    answer(str(request.response_url), reply)
    return {"status": status, "reason": reason, **data}


def _answer_unreadable(raw: Any, error: str) -> dict[str, Any]:
    """Fail a request that does not parse, if it says where to answer (else there is no one to tell)."""
    fields = raw if isinstance(raw, dict) else {}
    url = fields.get("ResponseURL")
    ids = [fields.get(k) for k in ("StackId", "RequestId", "LogicalResourceId")]
    if isinstance(url, str) and url.startswith(("https://", "http://")) and all(isinstance(i, str) for i in ids):
        physical_id = fields.get("PhysicalResourceId") or "unreadable-request"
        answer(url, CustomResourceAnswer("FAILED", str(physical_id), *ids, reason=error))
    return {"status": "FAILED", "reason": error}
