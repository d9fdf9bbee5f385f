"""Stops whose answer comes later (an SSM command: a Slurm job's scancel or requeue), kept in the table until the
sweeper has read it (`runtime.settle`):

    pk = "pending-stop"   sk = "<sent at>#<job key>"   the job, its platform, the commands, the decision's audit record

    pending = PendingStops(store)
    pending.track(PendingStop(...), now)
    for stop in pending.oldest(10): ...
    outcome = pending.settle(stop, {"ok": True, "detail": "cancelled (CANCELLED)"})   # None: another sweep had it
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.store import Store
from stallwatch.core.signals import Platform

PENDING_STOP_PK = "pending-stop"


@dataclass(frozen=True)
class PendingStop:
    """A stop sent and not yet answered: whose, which commands, and the decision (audit record) it acted on."""

    job_key: str
    platform: Platform
    job: str
    audit_sk: str
    commands: tuple[str, ...]
    detail: str  # what the stop said when it was sent
    sent_at: float

    @property
    def sk(self) -> str:
        return f"{self.sent_at:017.3f}#{self.job_key}"


class PendingStops:
    """The pending-stop items of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def track(self, stop: PendingStop, now: float) -> None:
        item = {
            "pk": {"S": PENDING_STOP_PK},
            "sk": {"S": stop.sk},
            "stop": {"S": json.dumps(asdict(stop))},
            "expires_at": self.store.expires(now),
        }
        self.store.dynamodb.put_item(TableName=self.store.table, Item=item)

    def oldest(self, limit: int) -> list[PendingStop]:
        """The `limit` oldest stops not answered yet (one Query)."""
        return [_stop(json.loads(item["stop"]["S"])) for item in self.store.first_items(PENDING_STOP_PK, limit)]

    def settle(self, stop: PendingStop, answer: dict[str, Any]) -> dict[str, Any] | None:
        """The stop answered: its item removed and the answer added to the decision's outcome (`stop.answer`, and
        `stop.ok` as the answer says it went), in one transaction; the outcome as written, or None if another sweep
        settled it first."""
        dynamodb, table = self.store.dynamodb, self.store.table
        key = {"pk": {"S": stop.job_key}, "sk": {"S": stop.audit_sk}}
        record = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item") or {}
        outcome = json.loads(record["outcome"]["S"]) if "outcome" in record else {}
        outcome["stop"] = {**outcome.get("stop", {}), "ok": answer["ok"], "answer": answer}
        try:
            dynamodb.transact_write_items(
                TransactItems=[
                    {
                        "Delete": {
                            "TableName": table,
                            "Key": {"pk": {"S": PENDING_STOP_PK}, "sk": {"S": stop.sk}},
                            "ConditionExpression": "attribute_exists(pk)",
                        }
                    },
                    {"Update": AuditTrail(self.store).outcome_update(stop.job_key, stop.audit_sk, outcome)},
                ]
            )
        except dynamodb.exceptions.TransactionCanceledException:
            return None
        return outcome


def _stop(data: dict[str, Any]) -> PendingStop:
    return PendingStop(**(data | {"platform": Platform(data["platform"]), "commands": tuple(data["commands"])}))
