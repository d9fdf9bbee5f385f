"""A small moto extension: iam:SimulatePrincipalPolicy evaluates a role's policies, which moto 5.2.5 does not offer.

    from localrun import moto_iam_simulate
    moto_iam_simulate.install()
    iam.simulate_principal_policy(PolicySourceArn=role_arn, ActionNames=["sagemaker:StopTrainingJob"],
                                  ResourceArns=[job_arn], ContextEntries=[...])

The role's inline and attached policies are evaluated as IAM does for one principal: an explicit Deny wins, then an
Allow whose action, resource and every condition match; else an implicit deny. Actions and resources match with
``*`` and ``?`` wildcards (actions case-insensitively); the condition operators are the ones Stallwatch's policies
use: StringEquals, StringEqualsIgnoreCase, StringLike, StringNotEquals, Null and their ForAllValues:/ForAnyValue:
forms. A condition key missing from the context fails every operator but Null, as in IAM. Any other operator raises,
so a policy this evaluator cannot read is never reported as allowed or denied.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from moto.core.responses import ActionResult
from moto.iam.responses import IamResponse

ALLOWED, EXPLICIT_DENY, IMPLICIT_DENY = "allowed", "explicitDeny", "implicitDeny"


class UnsupportedConditionError(ValueError):
    """A condition operator this evaluator does not implement."""


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _wildcard(pattern: str, value: str, ignore_case: bool = False) -> bool:
    if ignore_case:
        pattern, value = pattern.lower(), value.lower()
    return re.fullmatch(fnmatch.translate(pattern), value) is not None


OPERATORS: dict[str, Callable[[list[str], list[str]], bool]] = {
    "StringEquals": lambda wanted, given: any(g in wanted for g in given),
    "StringEqualsIgnoreCase": lambda wanted, given: any(g.lower() in {w.lower() for w in wanted} for g in given),
    "StringLike": lambda wanted, given: any(_wildcard(w, g) for w in wanted for g in given),
    "StringNotEquals": lambda wanted, given: all(g not in wanted for g in given),
}


def _condition_holds(operator: str, key: str, wanted: Any, context: dict[str, list[str]]) -> bool:
    wanted_values = [str(v).lower() if isinstance(v, bool) else str(v) for v in _as_list(wanted)]
    given = context.get(key.lower())
    if operator == "Null":  # "true": the key is absent; "false": it is present
        return (given is None) == (wanted_values[0] == "true")
    qualifier, _, base = operator.rpartition(":")
    if base not in OPERATORS:
        raise UnsupportedConditionError(f"condition operator {operator!r} is not evaluated by this extension")
    if given is None:
        return qualifier == "ForAllValues"  # an empty set: ForAllValues holds, everything else fails
    if qualifier == "ForAllValues":
        return all(OPERATORS[base](wanted_values, [g]) for g in given)
    return OPERATORS[base](wanted_values, given)


def _matches(statement: dict[str, Any], action: str, resource: str, context: dict[str, list[str]]) -> bool:
    actions = _as_list(statement.get("Action", []))
    if not any(_wildcard(a, action, ignore_case=True) for a in actions):
        return False
    if not any(_wildcard(r, resource) for r in _as_list(statement.get("Resource", []))):
        return False
    return all(
        _condition_holds(operator, key, wanted, context)
        for operator, conditions in statement.get("Condition", {}).items()
        for key, wanted in conditions.items()
    )


def evaluate(documents: list[dict[str, Any]], action: str, resource: str, context: dict[str, list[str]]) -> str:
    """IAM's decision for one principal whose policies are `documents`."""
    statements = [s for d in documents for s in _as_list(d.get("Statement", []))]
    matching = [s for s in statements if _matches(s, action, resource, context)]
    if any(s.get("Effect") == "Deny" for s in matching):
        return EXPLICIT_DENY
    return ALLOWED if any(s.get("Effect") == "Allow" for s in matching) else IMPLICIT_DENY


def _document(raw: Any) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else json.loads(unquote(raw))


def _role_documents(backend: Any, role_arn: str) -> list[dict[str, Any]]:
    name = role_arn.rsplit("/", 1)[-1]
    role = backend.get_role(name)
    documents = [_document(doc) for doc in role.policies.values()]
    for policy in role.managed_policies.values():
        version = next(v for v in policy.versions if v.is_default)
        documents.append(_document(version.document))
    return documents


def _simulate_principal_policy(self: IamResponse) -> ActionResult:
    source = self._get_param("PolicySourceArn")
    actions = self._get_param("ActionNames", [])
    resources = self._get_param("ResourceArns", []) or ["*"]
    context: dict[str, list[str]] = {}
    for entry in self._get_param("ContextEntries", []):
        context[entry["ContextKeyName"].lower()] = [str(v) for v in entry["ContextKeyValues"]]
    documents = _role_documents(self.backend, source)
    results = [
        {
            "EvalActionName": action,
            "EvalResourceName": resource,
            "EvalDecision": evaluate(documents, action, resource, context),
        }
        for action in actions
        for resource in resources
    ]
    return ActionResult({"EvaluationResults": results, "IsTruncated": False})


def install() -> None:
    IamResponse.simulate_principal_policy = _simulate_principal_policy  # type: ignore[attr-defined]
