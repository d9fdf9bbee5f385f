"""Slack messages not delivered yet, kept in the table for the sweeper to post again (`runtime.repost`).

    pk = "pending-post"   sk = "<audit sk>#<job key>"   the message, the audit outcome so far, the attempts

One partition for every undelivered Slack message: the sweeper reads it with one Query, and finds the posts of jobs
that have ended too (their state item is deleted and they are no longer listed as running). Empty unless Slack failed.
A post is kept in the transaction that records the failed attempt's outcome, so no message is lost.

    posts = PendingPosts(store)
    posts.record_unsent(key, audit_sk, outcome, message, now)
    for post in posts.oldest(10):
        if posts.claim(post, now, hold_seconds): ... posts.finish(post, outcome, keep=False)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.store import Store

PENDING_POST_PK = "pending-post"


@dataclass(frozen=True)
class PendingPost:
    """A Slack message that was not delivered, as read from its `pending-post` item."""

    sk: str
    job_key: str
    audit_sk: str  # the decision whose outcome the attempts are added to
    message: dict[str, Any]  # the rendered message, posted again as it was
    outcome: dict[str, Any]  # the audit record's outcome so far (stop result, Slack attempts)
    attempts: int  # posts tried so far, the first one included


class PendingPosts:
    """The pending-post items of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.audit = AuditTrail(store)

    def item(
        self, key: str, audit_sk: str, outcome: dict[str, Any], message: dict[str, Any], now: float
    ) -> dict[str, Any]:
        """The item of a message whose first post failed, for a transaction that records that outcome."""
        return {
            "pk": {"S": PENDING_POST_PK},
            "sk": {"S": f"{audit_sk}#{key}"},
            "job_key": {"S": key},
            "audit_sk": {"S": audit_sk},
            "message": {"S": json.dumps(message)},
            "outcome": {"S": json.dumps(outcome, default=str)},
            "attempts": {"N": "1"},
            "expires_at": self.store.expires(now),
        }

    def record_unsent(
        self, key: str, audit_sk: str, outcome: dict[str, Any], message: dict[str, Any], now: float
    ) -> None:
        """`AuditTrail.record_outcome` for a message (a resume follow-up, a run summary) whose Slack post failed: the
        message is kept for the sweeper to post again, in the same transaction (one call, as for a delivered post)."""
        self.store.dynamodb.transact_write_items(
            TransactItems=[
                {"Update": self.audit.outcome_update(key, audit_sk, outcome)},
                {"Put": {"TableName": self.store.table, "Item": self.item(key, audit_sk, outcome, message, now)}},
            ]
        )

    def oldest(self, limit: int) -> list[PendingPost]:
        """The oldest `limit` undelivered Slack messages (their sort key starts with the decision's time)."""
        return [
            PendingPost(
                sk=item["sk"]["S"],
                job_key=item["job_key"]["S"],
                audit_sk=item["audit_sk"]["S"],
                message=json.loads(item["message"]["S"]),
                outcome=json.loads(item["outcome"]["S"]),
                attempts=int(item["attempts"]["N"]),
            )
            for item in self.store.first_items(PENDING_POST_PK, limit)
        ]

    def claim(self, post: PendingPost, now: float, hold_seconds: float) -> bool:
        """Take the next attempt at a pending post: only if no one took an attempt since it was read and no claim
        is held, so two sweeper runs never post one message twice. False if another run has it."""
        dynamodb = self.store.dynamodb
        try:
            dynamodb.update_item(
                TableName=self.store.table,
                Key={"pk": {"S": PENDING_POST_PK}, "sk": {"S": post.sk}},
                UpdateExpression="SET attempts = :next, claimed_until = :until",
                ConditionExpression=(
                    "attempts = :seen AND (attribute_not_exists(claimed_until) OR claimed_until < :now)"
                ),
                ExpressionAttributeValues={
                    ":seen": {"N": str(post.attempts)},
                    ":next": {"N": str(post.attempts + 1)},
                    ":until": {"N": f"{now + hold_seconds:.3f}"},
                    ":now": {"N": f"{now:.3f}"},
                },
            )
        except dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def finish(self, post: PendingPost, outcome: dict[str, Any], keep: bool) -> None:
        """After an attempt: the audit outcome updated and, in the same transaction, the pending post released for
        the next attempt (`keep`) or removed (delivered, or given up)."""
        pending_key = {"pk": {"S": PENDING_POST_PK}, "sk": {"S": post.sk}}
        if keep:
            pending: dict[str, Any] = {
                "Update": {
                    "TableName": self.store.table,
                    "Key": pending_key,
                    "UpdateExpression": "SET outcome = :o REMOVE claimed_until",
                    "ExpressionAttributeValues": {":o": {"S": json.dumps(outcome, default=str)}},
                }
            }
        else:
            pending = {"Delete": {"TableName": self.store.table, "Key": pending_key}}
        self.store.dynamodb.transact_write_items(
            TransactItems=[{"Update": self.audit.outcome_update(post.job_key, post.audit_sk, outcome)}, pending]
        )
