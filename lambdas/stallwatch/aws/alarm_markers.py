"""Which jobs have their alarms in place, kept in the table so the sweeper need not list alarms to know.

pk = "job#sagemaker#my-job"  sk = "alarms"        how many of the job's alarms are in place, since when
pk = "alarm-audit"           sk = "alarm-audit"   when a sweep last listed every alarm

markers = AlarmMarkers(store)
markers.mark(key, put=3, alarms=3, now=now)
markers.provisioned([key, ...])      # {key: Provisioned(put, alarms)}: 100 keys per BatchGetItem call
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from stallwatch.aws.store import Store

ALARMS_SK = "alarms"
ALARM_AUDIT_PK = "alarm-audit"


@dataclass(frozen=True)
class Provisioned:
    """A job's alarm marker: `put` of its `alarms` are in place."""

    put: int
    alarms: int

    @property
    def complete(self) -> bool:
        return self.put >= self.alarms


class AlarmMarkers:
    """The alarm markers of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def provisioned(self, keys: list[str]) -> dict[str, Provisioned]:
        """How many of their alarms the jobs (of `keys`) have in place, from their markers (jobs without one have
        none): 100 keys per BatchGetItem call."""
        return {
            key: Provisioned(int(item["put"]["N"]), int(item["alarms"]["N"]))
            for key, item in self.store.batch_get(keys, ALARMS_SK).items()
        }

    def mark(self, key: str, put: int, alarms: int, now: float) -> None:
        """Remember how many of the job's alarms are in place, so the sweeper need not list alarms to know."""
        item = {
            "pk": {"S": key},
            "sk": {"S": ALARMS_SK},
            "put": {"N": str(put)},
            "alarms": {"N": str(alarms)},
            "at": {"N": f"{now:.3f}"},
            "expires_at": self.store.expires(now),
        }
        self.store.dynamodb.put_item(TableName=self.store.table, Item=item)

    def forget(self, key: str) -> None:
        """Drop the job's alarm marker; a job that never had one is not written to."""
        dynamodb = self.store.dynamodb
        with contextlib.suppress(dynamodb.exceptions.ConditionalCheckFailedException):
            dynamodb.delete_item(
                TableName=self.store.table,
                Key={"pk": {"S": key}, "sk": {"S": ALARMS_SK}},
                ConditionExpression="attribute_exists(pk)",
            )

    def claim_audit(self, now: float, every_seconds: float) -> bool:
        """True for the one sweep that may list every alarm now: none did in the last `every_seconds`."""
        dynamodb = self.store.dynamodb
        try:
            dynamodb.update_item(
                TableName=self.store.table,
                Key={"pk": {"S": ALARM_AUDIT_PK}, "sk": {"S": ALARM_AUDIT_PK}},
                UpdateExpression="SET audited_at = :now",
                ConditionExpression="attribute_not_exists(audited_at) OR audited_at <= :due",
                ExpressionAttributeValues={":now": {"N": str(now)}, ":due": {"N": str(now - every_seconds)}},
            )
        except dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True
