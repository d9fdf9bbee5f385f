"""The table's recovery items: one recovery in place per stall, and the recoveries under way.

    pk = "job#ec2#llm-70b"  sk = "recover#<stall since>"        the claim: once per stall; its status, restart, step
    pk = "recovery"         sk = "<started at>#<job key>"       a recovery under way: its phase, commands, hold

The claim and the first audit record are written with the recovery in one transaction, so a duplicated or
concurrent stop decision recovers once; each later step is claimed on the recovery (its version, no live hold),
with its own audit record, so two sweeps never take one step twice. The shared partition is empty unless a
recovery is under way: one Query a sweep finds them all.

    recoveries = Recoveries(store)
    audit_sk = recoveries.start(recovery, audit, now, hold_until)          # None: this stall is recovered already
    for recovery in recoveries.under_way(10): ...
    audit_sk = recoveries.advance(recovery, recovery.at_phase(...), now, hold_until=..., audit=...)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.store import NOT_EXISTS, Store
from stallwatch.core.signals import Platform

RECOVERY_PK = "recovery"
CLAIM_SK_PREFIX = "recover#"
# A claim's status: under way, then how it ended.
RECOVERING, RESTARTED, STOPPED, ENDED = "recovering", "restarted", "stopped", "ended"
# A recovery's phases: its health check sent, waiting for a replacement node, restarted (waiting for a step).
CHECKING, REPLACING, RESTARTING = "checking", "replacing", "restarted"


@dataclass(frozen=True)
class Recovery:
    """One recovery in place of a job (an EC2 job's): what it started from, and where it is."""

    job_key: str
    job: str
    stall_since: float  # the stall it recovers (the engine's `stall_since`): one recovery per stall
    decided_at: float  # the engine's stop decision it stands in for (the state's `stopped_at`)
    decision_sk: str  # that decision's audit record: its Slack message opens the thread
    started_at: float
    attempt: int
    allowed: int
    diagnosis: str
    step: float | None  # the step the job had reached when it stalled
    stall_onset: float
    nodes: tuple[str, ...]  # the job's nodes when it stalled
    types: dict[str, str]  # node -> instance type
    phase: str = CHECKING
    phase_at: float = 0.0  # when the phase began (its waits count from here)
    commands: tuple[str, ...] = ()  # the phase's SSM commands
    keep: tuple[str, ...] = ()  # the nodes left after a take-out
    replaced: tuple[str, ...] = ()  # nodes their Auto Scaling group replaces
    restarted_at: float | None = None
    thread_ts: str | None = None
    moving: bool = False  # a move off a host before its scheduled event (`runtime.health`), not a stall's recovery
    version: int = 0
    held_until: float = 0.0  # a live hold: a Lambda is taking a step

    @property
    def platform(self) -> Platform:
        """The job's platform, from its key (``job#<platform>#<name>``)."""
        return Platform(self.job_key.split("#", 2)[1])

    @property
    def claim_sk(self) -> str:
        return f"{CLAIM_SK_PREFIX}{self.stall_since:017.3f}"

    @property
    def sk(self) -> str:
        return f"{self.started_at:017.3f}#{self.job_key}"

    def at_phase(self, phase: str, now: float, **changes: Any) -> Recovery:
        return replace(self, phase=phase, phase_at=now, commands=(), **changes)


@dataclass(frozen=True)
class Claim:
    """A stall's claim: how its recovery went (the budget counts the restarts, the no-progress rule their steps)."""

    status: str
    step: float | None = None
    restarted_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Recoveries:
    """Recovery items in the Store's table."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dynamodb = store.dynamodb
        self.table = store.table
        self.audit = AuditTrail(store)

    def claim(self, job_key: str, stall_since: float) -> Claim | None:
        """The stall's claim, if a recovery took it."""
        key = {"pk": {"S": job_key}, "sk": {"S": f"{CLAIM_SK_PREFIX}{stall_since:017.3f}"}}
        item = self.dynamodb.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        return _claim(item) if item else None

    def claims(self, job_key: str) -> list[Claim]:
        """Every stall's claim of the job, oldest first."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :kind)",
            ExpressionAttributeValues={":pk": {"S": job_key}, ":kind": {"S": CLAIM_SK_PREFIX}},
            ConsistentRead=True,
        )
        return [_claim(item) for page in pages for item in page["Items"]]

    def start(self, recovery: Recovery, audit: dict[str, Any], now: float, hold_until: float) -> str | None:
        """Claim the stall and start its recovery, with its first audit record, in one transaction; the record's sort
        key, or None if the stall was claimed before (a duplicated or concurrent decision)."""
        audit_sk = f"audit#{now:017.3f}#recover"
        claim = {
            "pk": {"S": recovery.job_key},
            "sk": {"S": recovery.claim_sk},
            "status": {"S": RECOVERING},
            "claim": {"S": json.dumps({"step": recovery.step})},
            "expires_at": self.store.expires(now),
        }
        held = replace(recovery, held_until=hold_until)
        try:
            self.dynamodb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": self.table, "Item": claim, "ConditionExpression": NOT_EXISTS}},
                    {
                        "Put": {
                            "TableName": self.table,
                            "Item": self._item(held, now),
                            "ConditionExpression": NOT_EXISTS,
                        }
                    },
                    self.audit.put(recovery.job_key, audit_sk, audit, now),
                ]
            )
        except self.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def under_way(self, limit: int) -> list[Recovery]:
        """The oldest `limit` recoveries under way."""
        items = self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": RECOVERY_PK}},
            ConsistentRead=True,
            Limit=limit,
        )["Items"]
        return [_recovery(item) for item in items]

    def advance(
        self,
        seen: Recovery,
        changed: Recovery,
        now: float,
        hold_until: float | None = None,
        audit: dict[str, Any] | None = None,
        claim: Claim | None = None,
        own_hold: bool = False,
    ) -> str | None:
        """Write `changed` over the recovery as it was read (`seen`: its version, and no live hold unless it is this
        Lambda's own, `own_hold`), held until `hold_until` (None: released); with a step's `audit` record and the
        stall's `claim` updated, in one transaction. The audit record's sort key ("" without one), or None if another
        run moved the recovery first."""
        condition, values = _as_read(seen, now, own_hold)
        values |= {":next": {"N": str(seen.version + 1)}, ":r": {"S": _dump(changed)}}
        expression = "SET recovery = :r, version = :next"
        if hold_until is None:
            expression += " REMOVE held"
        else:
            expression += ", held = :until"
            values[":until"] = {"N": f"{hold_until:.3f}"}
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": self._key(seen),
                    "UpdateExpression": expression,
                    "ConditionExpression": condition,
                    "ExpressionAttributeValues": values,
                }
            }
        ]
        if claim is not None:
            items.append({"Update": self._claim_update(seen, claim)})
        return self._write(seen, items, now, audit, changed.phase)

    def finish(
        self, seen: Recovery, claim: Claim, now: float, audit: dict[str, Any] | None = None, own_hold: bool = True
    ) -> str | None:
        """End the recovery: its item removed (if still at the version read), the stall's claim given its status, and
        its last audit record, in one transaction. The record's sort key ("" without one), or None if lost."""
        condition, values = _as_read(seen, now, own_hold)
        items: list[dict[str, Any]] = [
            {
                "Delete": {
                    "TableName": self.table,
                    "Key": self._key(seen),
                    "ConditionExpression": condition,
                    "ExpressionAttributeValues": values,
                }
            },
            {"Update": self._claim_update(seen, claim)},
        ]
        return self._write(seen, items, now, audit, claim.status)

    def _write(
        self, seen: Recovery, items: list[dict[str, Any]], now: float, audit: dict[str, Any] | None, step: str
    ) -> str | None:
        """`items` and the step's audit record in one transaction: the record's sort key ("" without one), or None
        if a condition failed (another run moved the recovery first)."""
        audit_sk = ""
        if audit is not None:
            audit_sk = f"audit#{now:017.3f}#recover-{step}"
            items = [*items, self.audit.put(seen.job_key, audit_sk, audit, now)]
        try:
            self.dynamodb.transact_write_items(TransactItems=items)
        except self.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def thread_of(self, recovery: Recovery) -> str | None:
        """The Slack thread of the recovery: its stop decision's message (bot mode), from that audit record."""
        if recovery.thread_ts:
            return recovery.thread_ts
        key = {"pk": {"S": recovery.job_key}, "sk": {"S": recovery.decision_sk}}
        item = self.dynamodb.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item") or {}
        outcome = json.loads(item["outcome"]["S"]) if "outcome" in item else {}
        return (outcome.get("slack") or {}).get("ts")

    def _key(self, recovery: Recovery) -> dict[str, Any]:
        return {"pk": {"S": RECOVERY_PK}, "sk": {"S": recovery.sk}}

    def _item(self, recovery: Recovery, now: float) -> dict[str, Any]:
        item = {
            **self._key(recovery),
            "recovery": {"S": _dump(recovery)},
            "version": {"N": str(recovery.version)},
            "expires_at": self.store.expires(now),
        }
        if recovery.held_until:
            item["held"] = {"N": f"{recovery.held_until:.3f}"}
        return item

    def _claim_update(self, recovery: Recovery, claim: Claim) -> dict[str, Any]:
        details = {"step": claim.step, "restarted_at": claim.restarted_at, **claim.extra}
        return {
            "TableName": self.table,
            "Key": {"pk": {"S": recovery.job_key}, "sk": {"S": recovery.claim_sk}},
            "UpdateExpression": "SET #st = :s, claim = :c",
            "ExpressionAttributeNames": {"#st": "status"},
            "ExpressionAttributeValues": {":s": {"S": claim.status}, ":c": {"S": json.dumps(details)}},
        }


def _as_read(seen: Recovery, now: float, own_hold: bool) -> tuple[str, dict[str, Any]]:
    """The condition that the recovery is as read: its version, and no live hold unless this Lambda's own."""
    condition = "version = :seen" + ("" if own_hold else " AND (attribute_not_exists(held) OR held < :now)")
    values: dict[str, Any] = {":seen": {"N": str(seen.version)}}
    if not own_hold:
        values[":now"] = {"N": f"{now:.3f}"}
    return condition, values


def _dump(recovery: Recovery) -> str:
    return json.dumps({k: v for k, v in asdict(recovery).items() if k not in ("version", "held_until")})


def _recovery(item: dict[str, Any]) -> Recovery:
    data = json.loads(item["recovery"]["S"])
    for name in ("nodes", "commands", "keep", "replaced"):
        data[name] = tuple(data.get(name) or ())
    held = float(item["held"]["N"]) if "held" in item else 0.0
    return Recovery(**data, version=int(item["version"]["N"]), held_until=held)


def _claim(item: dict[str, Any]) -> Claim:
    details = json.loads(item["claim"]["S"]) if "claim" in item else {}
    step, restarted_at = details.pop("step", None), details.pop("restarted_at", None)
    return Claim(status=item["status"]["S"], step=step, restarted_at=restarted_at, extra=details)
