"""A small moto extension: CloudWatch Logs subscription filters that deliver to a Lambda function as CloudWatch does.

moto 5.2.5 hands every event put to a subscribed log group to the destination, whatever the filter's pattern, and
lets a filter name any existing function. After `install()`:
- PutSubscriptionFilter with a Lambda destination needs the function's resource policy to let `logs.amazonaws.com`
  invoke it (for this log group, where the statement names a SourceArn; of this account, where a SourceAccount):
  else InvalidParameterException, as CloudWatch Logs answers; and it updates a filter of its name in place when the
  group's two slots are taken (moto refuses with LimitExceededException);
- PutLogEvents delivers to each filter only the events its pattern matches (`moto.logs.models.EventMessageFilter`,
  which `localrun.moto_logs_filter` extends to CloudWatch's terms), and nothing when none does; their ids are strings,
  as CloudWatch Logs sends them (moto's are numbers). moto invokes the
  function with ``{"awslogs": {"data": base64(gzip(json))}}`` (one stream's events), which
  `localrun.moto_lambda_invoke` runs in this process.

    from localrun import moto_logs_subscription
    moto_logs_subscription.install()
"""

from __future__ import annotations

import fnmatch
from typing import Any

from moto.awslambda.utils import get_backend
from moto.logs import models
from moto.logs.exceptions import InvalidParameterException

LOGS_PRINCIPAL = "logs.amazonaws.com"
NO_PERMISSION = (
    "Could not execute the lambda function. Make sure you have given CloudWatch Logs permission to execute your "
    "function."
)

_originals: dict[str, Any] = {}


def invokes(policy: dict[str, Any], group_arn: str, account: str) -> bool:
    """Whether a function's resource policy lets CloudWatch Logs invoke it for the log group `group_arn`."""
    for statement in policy.get("Statement", []):
        principal = statement.get("Principal", {})
        services = principal.get("Service") if isinstance(principal, dict) else principal
        services = [services] if isinstance(services, str) else services or []
        if statement.get("Effect") != "Allow" or LOGS_PRINCIPAL not in services:
            continue
        if statement.get("Action") not in ("lambda:InvokeFunction", "lambda:*"):
            continue
        condition = statement.get("Condition", {})
        source_arn = {**condition.get("ArnEquals", {}), **condition.get("ArnLike", {})}.get("AWS:SourceArn")
        source_account = condition.get("StringEquals", {}).get("AWS:SourceAccount")
        if source_arn is not None and not fnmatch.fnmatchcase(group_arn, source_arn):
            continue
        if source_account is not None and source_account != account:
            continue
        return True
    return False


def _put_subscription_filter(
    self: models.LogsBackend,
    log_group_name: str,
    filter_name: str,
    filter_pattern: str,
    destination_arn: str,
    role_arn: str,
) -> None:
    if destination_arn.split(":")[2] == "lambda" and log_group_name in self.groups:
        group_arn = f"arn:aws:logs:{self.region_name}:{self.account_id}:log-group:{log_group_name}:*"
        function = get_backend(self.account_id, self.region_name).get_function(destination_arn)
        if not invokes({"Statement": function.policy.statements}, group_arn, self.account_id):
            raise InvalidParameterException(NO_PERMISSION)
    _originals["put"](self, log_group_name, filter_name, filter_pattern, destination_arn, role_arn)


def _group_put_subscription_filter(
    self: models.LogGroup, filter_name: str, filter_pattern: str, destination_arn: str, role_arn: str
) -> None:
    if filter_name in self.subscription_filters:  # an update holds its own slot
        self.subscription_filters[filter_name].update(filter_pattern, destination_arn, role_arn)
        return
    _originals["group_put"](self, filter_name, filter_pattern, destination_arn, role_arn)


def _send_log_events(
    self: models.LogStream, service: str, destination_arn: str, filter_name: str, log_events: list[dict[str, Any]]
) -> None:
    subscription = self.log_group.subscription_filters.get(filter_name)
    pattern = models.EventMessageFilter(subscription.filter_pattern if subscription else "")
    # CloudWatch Logs' event ids are strings of digits; moto's, numbers
    matched = [{**event, "id": str(event["id"])} for event in log_events if pattern.matches(event["message"])]
    if matched:
        _originals["send"](self, service, destination_arn, filter_name, matched)


def install() -> None:
    if not _originals:
        _originals["put"] = models.LogsBackend.put_subscription_filter
        _originals["group_put"] = models.LogGroup.put_subscription_filter
        _originals["send"] = models.LogStream._send_log_events
        models.LogsBackend.put_subscription_filter = _put_subscription_filter  # type: ignore[method-assign]
        models.LogGroup.put_subscription_filter = _group_put_subscription_filter  # type: ignore[method-assign]
        models.LogStream._send_log_events = _send_log_events  # type: ignore[method-assign]
