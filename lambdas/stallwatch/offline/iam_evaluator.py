"""A resource policy's answer to one question, as IAM evaluates it: may CloudWatch do these actions on this resource
for this alarm of this account (an SNS topic's policy, a KMS key's)? The doctor asks it of the health topic and its key.

    serves(topic_policy, ("sns:Publish",), topic_arn, "123456789012", alarm_arn)   # True: an Allow, no Deny

Principals, actions and resources match as IAM's wildcards do; the condition operators StringEquals, StringLike,
ArnEquals, ArnLike and Bool (and their IfExists forms) are evaluated against the alarm's context (its account and ARN,
over TLS); any other operator never holds, so an unknown condition reads as a refusal, never a grant.
"""

from __future__ import annotations

import fnmatch
from typing import Any

CLOUDWATCH_PRINCIPAL = "cloudwatch.amazonaws.com"


def serves(policy: dict[str, Any], actions: tuple[str, ...], resource: str, account: str, alarm: str) -> bool:
    """Whether `policy` lets CloudWatch do every one of `actions` on `resource` for the alarm `alarm` of `account`
    (over TLS): an Allow that matches and no Deny that does."""
    context = {"aws:sourceaccount": account, "aws:sourcearn": alarm, "aws:securetransport": "true"}
    statements = policy.get("Statement", [])
    statements = [statements] if isinstance(statements, dict) else statements
    for action in actions:
        matching = [s for s in statements if _applies(s, action, resource, context)]
        if not any(s.get("Effect") == "Allow" for s in matching) or any(s.get("Effect") == "Deny" for s in matching):
            return False
    return True


def _applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    """Whether a policy statement is about CloudWatch doing `action` on `resource` under `context` (condition keys
    lower case). A condition operator it does not know never holds."""
    principal = statement.get("Principal")
    if principal != "*":
        named = principal.get("Service", []) if isinstance(principal, dict) else []
        aws = principal.get("AWS") if isinstance(principal, dict) else None
        if CLOUDWATCH_PRINCIPAL not in _listed(named) and "*" not in _listed(aws or []):
            return False
    if not any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in _listed(statement.get("Action", []))):
        return False
    if not any(fnmatch.fnmatchcase(resource, r) or r == "*" for r in _listed(statement.get("Resource", []))):
        return False
    for operator, tests in statement.get("Condition", {}).items():
        base = operator.removesuffix("IfExists")
        for key, wanted in tests.items():
            value = context.get(key.lower())
            if value is None:
                if base == operator:
                    return False
                continue
            if not _holds(base, value, _listed(wanted)):
                return False
    return True


def _holds(operator: str, value: str, wanted: list[str]) -> bool:
    if operator in ("StringEquals", "ArnEquals"):
        return value in wanted
    if operator in ("StringLike", "ArnLike"):
        return any(fnmatch.fnmatchcase(value, w) for w in wanted)
    if operator == "Bool":
        return value.lower() in (w.lower() for w in wanted)
    return False


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)
