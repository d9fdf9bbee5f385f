"""Events already handled, in the table: a duplicated delivery or a replayed request finds its claim and does nothing.

    pk = "event#<dedup key>"   sk = "event"   an alarm transition, a Slack request or a CLI call already handled

A decision claims its alarm's event in the transaction that commits it (`JobStates.commit`); a Slack request is
claimed on its own before it is acted on (`claim`).
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.store import NOT_EXISTS, Store

EVENT_SK = "event"


class EventClaims:
    """The event items of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, event_key: str, now: float) -> dict[str, Any]:
        """A transaction's Put of the claim on `event_key`, on condition that none was made before."""
        item = {"pk": {"S": f"event#{event_key}"}, "sk": {"S": EVENT_SK}, "expires_at": self.store.expires(now)}
        return {"Put": {"TableName": self.store.table, "Item": item, "ConditionExpression": NOT_EXISTS}}

    def claim(self, event_key: str, now: float, hold_seconds: float) -> bool:
        """Claim `event_key` (a Slack request) for `hold_seconds`; False if it was claimed before (a replay)."""
        expires = {"N": str(int(now + hold_seconds))}
        item = {"pk": {"S": f"event#{event_key}"}, "sk": {"S": EVENT_SK}, "expires_at": expires}
        dynamodb = self.store.dynamodb
        try:
            dynamodb.put_item(TableName=self.store.table, Item=item, ConditionExpression=NOT_EXISTS)
        except dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def handled(self, event_key: str) -> bool:
        """Whether `event_key` was claimed (one consistent GetItem)."""
        claim = {"pk": {"S": f"event#{event_key}"}, "sk": {"S": EVENT_SK}}
        return "Item" in self.store.dynamodb.get_item(TableName=self.store.table, Key=claim, ConsistentRead=True)
