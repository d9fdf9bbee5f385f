"""Resumed jobs whose progress Slack has not heard yet, in the table (`runtime.resume` watches them each sweep).

pk = "resume-watch"   sk = "<job key>"   the step the run had reached, when it restarted, the Slack thread

watches = ProgressWatches(store)
watches.watch(ProgressWatch(job_key, best_step, restarted_at), now)
for watch in watches.oldest(10): ...
audit_sk = watches.end(watch, {"action": "progress", ...}, now)   # None: another sweep ended it first
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.store import Store

RESUME_WATCH_PK = "resume-watch"


@dataclass(frozen=True)
class ProgressWatch:
    """A resumed job, watched until it passes the step its run had reached (then Slack hears how long it took)."""

    job_key: str  # the resumed job (its audit trail gets the follow-up)
    best_step: float
    restarted_at: float
    thread_ts: str | None = None


class ProgressWatches:
    """The progress watches of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def watch(self, watch: ProgressWatch, now: float) -> None:
        item = {
            "pk": {"S": RESUME_WATCH_PK},
            "sk": {"S": watch.job_key},
            "watch": {"S": json.dumps(asdict(watch))},
            "expires_at": self.store.expires(now),
        }
        self.store.dynamodb.put_item(TableName=self.store.table, Item=item)

    def oldest(self, limit: int) -> list[ProgressWatch]:
        return [
            ProgressWatch(**json.loads(item["watch"]["S"])) for item in self.store.first_items(RESUME_WATCH_PK, limit)
        ]

    def end(self, watch: ProgressWatch, audit: dict[str, Any] | None, now: float) -> str | None:
        """Remove a watch and, in the same transaction, audit why on the resumed job (`audit`, if any). The audit
        record's sort key ("" without one), or None if another run removed the watch first (so only one posts)."""
        audit_sk = f"audit#{now:017.3f}#progress" if audit is not None else ""
        items: list[dict[str, Any]] = [
            {
                "Delete": {
                    "TableName": self.store.table,
                    "Key": {"pk": {"S": RESUME_WATCH_PK}, "sk": {"S": watch.job_key}},
                    "ConditionExpression": "attribute_exists(pk)",
                }
            }
        ]
        if audit is not None:
            items.append(AuditTrail(self.store).put(watch.job_key, audit_sk, audit, now))
        dynamodb = self.store.dynamodb
        try:
            dynamodb.transact_write_items(TransactItems=items)
        except dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk
