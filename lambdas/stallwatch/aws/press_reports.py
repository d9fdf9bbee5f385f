"""The claim on posting back one failed Slack press (`runtime.failed_presses`): SQS delivers a message at least
once, so a press Lambda gave up applying may come twice, or to two invocations at once, and is posted back once.

    pk = "press-report#<press>"   sk = "press-report"   claimed_until while one posts it; reported_at once posted

    reports = PressReports(store)
    if reports.claim(press, now, hold_s):          # False: posted already, or being posted now
        ... post it ...
        reports.reported(press, now)               # or reports.release(press): the queue delivers it again

A claim runs out after `hold_s`, so a press whose invocation died holding it is posted by the next delivery.
"""

from __future__ import annotations

import hashlib

from stallwatch.aws.store import Store

PRESS_REPORT_PREFIX = "press-report#"
PRESS_REPORT_SK = "press-report"
UNCLAIMED = "attribute_not_exists(reported_at) AND (attribute_not_exists(claimed_until) OR claimed_until < :now)"


class PressReports:
    """The press-report items of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def claim(self, press: str, now: float, hold_s: float) -> bool:
        """Claim posting back `press` (its Slack signature) for `hold_s`; False if it was posted, or is held."""
        dynamodb = self.store.dynamodb
        try:
            dynamodb.update_item(
                TableName=self.store.table,
                Key=_key(press),
                UpdateExpression="SET claimed_until = :until, expires_at = :expires",
                ConditionExpression=UNCLAIMED,
                ExpressionAttributeValues={
                    ":until": {"N": f"{now + hold_s:.3f}"},
                    ":now": {"N": f"{now:.3f}"},
                    ":expires": self.store.expires(now),
                },
            )
        except dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def reported(self, press: str, now: float) -> None:
        """`press` was posted back: no delivery posts it again."""
        self.store.dynamodb.update_item(
            TableName=self.store.table,
            Key=_key(press),
            UpdateExpression="SET reported_at = :now REMOVE claimed_until",
            ExpressionAttributeValues={":now": {"N": f"{now:.3f}"}},
        )

    def release(self, press: str) -> None:
        """`press` could not be posted back: the next delivery tries."""
        self.store.dynamodb.update_item(
            TableName=self.store.table, Key=_key(press), UpdateExpression="REMOVE claimed_until"
        )


def _key(press: str) -> dict[str, dict[str, str]]:
    digest = hashlib.sha256(press.encode()).hexdigest()[:32]
    return {"pk": {"S": f"{PRESS_REPORT_PREFIX}{digest}"}, "sk": {"S": PRESS_REPORT_SK}}
