"""A job's audit trail in the table: one record per decision or action, then its outcome, and the once-only steps
that are audited as they are claimed (a run's summary, a resume, a recovery).

    pk = "job#sagemaker#my-job"  sk = "audit#<at>#<key>"   the record (JSON), then its outcome (JSON)
    pk = "job#sagemaker#my-job"  sk = "<step>[#...]"       a once-only step's claim ("summary", "resume#<stop at>")

    audit = AuditTrail(store)
    audit_sk = audit.claim(key, "summary", {"action": "summary"}, now)     # None: claimed before
    audit.record_outcome(key, audit_sk, {"summary": {"ok": True}})
    audit.stops(key)                                                      # Stallwatch's stops of the job

The other kinds write an audit record or its outcome in their own transactions, with `put` and `outcome_update`.
"""

from __future__ import annotations

import json
from typing import Any

from stallwatch.aws.store import NOT_EXISTS, Store
from stallwatch.core import record_budget
from stallwatch.core.resume import StopRecord, stop_of

# An audit record's JSON at most (DynamoDB's item is 400 KB): its outcome, keys and the incident's reasons fit beside
AUDIT_BYTES = 200_000


class AuditTrail:
    """The audit records of the table (`store`'s); it is the `core.platforms.interface.AuditTrail` goodput reads."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, key: str, sk: str, audit: dict[str, Any], now: float) -> dict[str, Any]:
        """A transaction's Put of an audit record."""
        return {"Put": {"TableName": self.store.table, "Item": audit_item(key, sk, audit, self.store.expires(now))}}

    def outcome_update(self, key: str, audit_sk: str, outcome: dict[str, Any]) -> dict[str, Any]:
        """The UpdateItem (or a transaction's Update) that sets an audit record's outcome."""
        return {
            "TableName": self.store.table,
            "Key": {"pk": {"S": key}, "sk": {"S": audit_sk}},
            "UpdateExpression": "SET outcome = :o",
            "ExpressionAttributeValues": {":o": {"S": json.dumps(outcome, default=str)}},
        }

    def record_outcome(self, key: str, audit_sk: str, outcome: dict[str, Any]) -> None:
        """Add what acting did (stop result, Slack result) to the decision's audit record."""
        self.store.dynamodb.update_item(**self.outcome_update(key, audit_sk, outcome))

    def claim(
        self, key: str, sk: str, audit: dict[str, Any], now: float, also: list[dict[str, Any]] | None = None
    ) -> str | None:
        """Claim a once-only step of a job (item `sk`) and audit it (and write `also`), in one transaction; the
        audit record's sort key, or None if claimed before."""
        audit_sk = f"audit#{now:017.3f}#{sk.split('#', 1)[0]}"
        expires = self.store.expires(now)
        claim = {"pk": {"S": key}, "sk": {"S": sk}, "expires_at": expires}
        table = self.store.table
        try:
            self.store.dynamodb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": table, "Item": claim, "ConditionExpression": NOT_EXISTS}},
                    {"Put": {"TableName": table, "Item": audit_item(key, audit_sk, audit, expires)}},
                    *(also or []),
                ]
            )
        except self.store.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def stops(self, key: str) -> list[StopRecord]:
        """Stallwatch's stops of a job (the engine's, not an operator's), oldest first, from its audit trail."""
        found = (stop_of(r["record"], r.get("outcome")) for r in self.records(key, "audit"))
        return [s for s in found if s is not None]

    def records(self, key: str, kind: str) -> list[dict[str, Any]]:
        """A job's audit records or incidents (`kind` "audit" or "incident"), oldest first, as plain dicts."""
        pages = self.store.dynamodb.get_paginator("query").paginate(
            TableName=self.store.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :kind)",
            ExpressionAttributeValues={":pk": {"S": key}, ":kind": {"S": f"{kind}#"}},
        )
        return [_plain(item) for page in pages for item in page["Items"]]


def audit_item(key: str, sk: str, audit: dict[str, Any], expires: dict[str, str]) -> dict[str, Any]:
    record = json.dumps(record_budget.fit(audit, AUDIT_BYTES), default=str)
    return {"pk": {"S": key}, "sk": {"S": sk}, "record": {"S": record}, "expires_at": expires}


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    """A DynamoDB item as a dict; JSON string attributes (`record`, `outcome`, `state`) decoded."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        ((kind, raw),) = value.items()
        out[name] = float(raw) if kind == "N" else raw
        if name in ("record", "outcome", "state", "reasons"):
            out[name] = json.loads(raw)
    return out
