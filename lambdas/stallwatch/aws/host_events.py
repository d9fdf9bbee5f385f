"""The table's items for AWS Health events (`runtime.health`): what each job was told of an event, and the moves
planned off the hosts they name.

    pk = "job#ec2#llm-70b"  sk = "host-event#<event id>#<instance>"                    the notice: claimed once
    pk = "host-move"        sk = "<window start>#<event id>#<instance>#<job key>"      a move planned, until taken

The event id is the first 24 hex digits of the SHA-256 of the event's ARN (an ARN may be 1,600 characters; a sort
key 1,024 bytes). AWS sends updates of one event with the same ARN: the notice, its audit record and the planned move
are written in one transaction on the notice's absence, so an event delivered twice acts once. The shared partition
is empty unless a move is planned: one Query a sweep finds the moves, the nearest window first.

    events = HostEvents(store)
    audit_sk = events.notify(key, platform, job, notice, audit, now)   # None: told before (a repeated event)
    for move in events.planned(10): ...
    audit_sk = events.take(move, notice.with_state(MOVING), audit, now)   # None: another sweep took it
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.store import NOT_EXISTS, Store
from stallwatch.core.health_events import PLANNED, HostNotice
from stallwatch.core.signals import Platform

MOVE_PK = "host-move"
NOTICE_SK_PREFIX = "host-event#"
EVENT_ID_HEX = 24


def event_id(event_arn: str) -> str:
    return hashlib.sha256(event_arn.encode()).hexdigest()[:EVENT_ID_HEX]


@dataclass(frozen=True)
class PlannedMove:
    """A move planned off a job's host, as its item holds it."""

    job_key: str
    platform: Platform
    job: str
    notice: HostNotice
    audit_sk: str  # the notice's audit record: its Slack message opens the move's thread
    sk: str

    @property
    def notice_sk(self) -> str:
        return notice_sk(self.notice)


def notice_sk(notice: HostNotice) -> str:
    return f"{NOTICE_SK_PREFIX}{event_id(notice.event_arn)}#{notice.instance}"


class HostEvents:
    """Notices and planned moves in the Store's table."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dynamodb = store.dynamodb
        self.table = store.table

    def notify(
        self, key: str, platform: Platform, job: str, notice: HostNotice, audit: dict[str, Any], now: float
    ) -> str | None:
        """Keep the job's notice of the event, its audit record and, where one is planned, its move, in one
        transaction; the audit record's sort key, or None if the job was told of this event's host before."""
        audit_sk = f"audit#{now:017.3f}#host-event"
        item = {
            "pk": {"S": key},
            "sk": {"S": notice_sk(notice)},
            "notice": {"S": json.dumps(notice.as_json())},
            "expires_at": self.store.expires(max(now, notice.over_at)),
        }
        writes: list[dict[str, Any]] = [
            {"Put": {"TableName": self.table, "Item": item, "ConditionExpression": NOT_EXISTS}},
            AuditTrail(self.store).put(key, audit_sk, audit, now),
        ]
        if notice.state == PLANNED:
            move = PlannedMove(key, platform, job, notice, audit_sk, _move_sk(key, notice))
            writes.append({"Put": {"TableName": self.table, "Item": self._move_item(move, now)}})
        try:
            self.dynamodb.transact_write_items(TransactItems=writes)
        except self.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def notices(self, key: str) -> list[HostNotice]:
        """The job's notices, by event and instance."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :kind)",
            ExpressionAttributeValues={":pk": {"S": key}, ":kind": {"S": NOTICE_SK_PREFIX}},
        )
        return [HostNotice.of_json(json.loads(item["notice"]["S"])) for page in pages for item in page["Items"]]

    def planned(self, limit: int) -> list[PlannedMove]:
        """The planned moves whose windows come first (`limit` of them)."""
        items = self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": MOVE_PK}},
            ConsistentRead=True,
            Limit=limit,
        )["Items"]
        return [_move(item) for item in items]

    def of_event(self, event_arn: str) -> list[PlannedMove]:
        """The planned moves of one event (its update closed it): the partition read whole, it holds only these."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": MOVE_PK}},
            ConsistentRead=True,
        )
        moves = (_move(item) for page in pages for item in page["Items"])
        return [m for m in moves if m.notice.event_arn == event_arn]

    def take(self, move: PlannedMove, notice: HostNotice, audit: dict[str, Any], now: float) -> str | None:
        """Take a planned move (its item removed, if still there), the notice as it now stands (`notice`) and the
        step's audit record, in one transaction: the record's sort key, or None if another run took it first."""
        audit_sk = f"audit#{now:017.3f}#move"
        writes = [
            {
                "Delete": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": MOVE_PK}, "sk": {"S": move.sk}},
                    "ConditionExpression": "attribute_exists(pk)",
                }
            },
            {"Update": self._notice_update(move.job_key, notice)},
            AuditTrail(self.store).put(move.job_key, audit_sk, audit, now),
        ]
        try:
            self.dynamodb.transact_write_items(TransactItems=writes)
        except self.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def update(self, key: str, notice: HostNotice) -> None:
        """The notice as it now stands (how its move went), for `stallwatch status`."""
        self.dynamodb.update_item(**self._notice_update(key, notice))

    def thread_of(self, key: str, audit_sk: str) -> str | None:
        """The Slack thread of a notice: its message's `ts` (bot mode), from its audit record's outcome."""
        item = (
            self.dynamodb.get_item(
                TableName=self.table, Key={"pk": {"S": key}, "sk": {"S": audit_sk}}, ConsistentRead=True
            ).get("Item")
            or {}
        )
        outcome = json.loads(item["outcome"]["S"]) if "outcome" in item else {}
        return (outcome.get("slack") or {}).get("ts")

    def _notice_update(self, key: str, notice: HostNotice) -> dict[str, Any]:
        return {
            "TableName": self.table,
            "Key": {"pk": {"S": key}, "sk": {"S": notice_sk(notice)}},
            "UpdateExpression": "SET notice = :n",
            "ExpressionAttributeValues": {":n": {"S": json.dumps(notice.as_json())}},
        }

    def _move_item(self, move: PlannedMove, now: float) -> dict[str, Any]:
        data = {"job_key": move.job_key, "platform": move.platform.value, "job": move.job, "audit_sk": move.audit_sk}
        return {
            "pk": {"S": MOVE_PK},
            "sk": {"S": move.sk},
            "move": {"S": json.dumps(data | {"notice": move.notice.as_json()})},
            "expires_at": self.store.expires(max(now, move.notice.over_at)),
        }


def _move_sk(key: str, notice: HostNotice) -> str:
    return f"{notice.start:017.3f}#{event_id(notice.event_arn)}#{notice.instance}#{key}"


def _move(item: dict[str, Any]) -> PlannedMove:
    data = json.loads(item["move"]["S"])
    notice = HostNotice.of_json(data["notice"])
    return PlannedMove(
        data["job_key"], Platform(data["platform"]), data["job"], notice, data["audit_sk"], item["sk"]["S"]
    )
