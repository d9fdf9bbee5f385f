"""The control plane's DynamoDB table, and what every kind of item in it shares: keys, TTL, batch reads.

One table, partition key ``pk``, sort key ``sk``, TTL attribute ``expires_at``. Each kind of item has its module,
a class over this helper (`JobStates(store)`, `AuditTrail(store)`, ...):

    job_states        pk = "job#sagemaker#my-job"  sk = "state"                  JobState (JSON), version, open
                                                                                incident, unfinished decision,
                                                                                failed-stop message, claim
                      pk = "job#sagemaker#my-job"  sk = "incident#<opened_at>"   status open/closed, diagnosis
    event_claims      pk = "event#<dedup key>"     sk = "event"                  an event already handled
    audit_trail       pk = "job#sagemaker#my-job"  sk = "audit#<at>#<key>"       one record per decision, its outcome
                      pk = "job#sagemaker#my-job"  sk = "summary"                the claim on a run's Slack summary
    alarm_markers     pk = "job#sagemaker#my-job"  sk = "alarms"                 how many of its alarms are in place
                      pk = "alarm-audit"           sk = "alarm-audit"            when a sweep last listed every alarm
    pending_posts     pk = "pending-post"          sk = "<audit sk>#<job key>"   a Slack message not delivered yet
    resume_tries      pk = "job#sagemaker#my-job"  sk = "resume#<stop at>"       the claim on resuming after a stop
                      pk = "resume-retry"          sk = "<stop at>#<job key>"    a resume being tried
    progress_watches  pk = "resume-watch"          sk = "<job key>"              a resumed job Slack has not heard of
    recoveries        pk = "job#ec2#my-job"        sk = "recover#<stall since>"  the claim on recovering one stall
                      pk = "recovery"              sk = "<started at>#<job key>" a recovery in place under way
    pending_stops     pk = "pending-stop"          sk = "<sent at>#<job key>"    a stop whose answer comes later
    slurm_jobs        pk = "job#slurm#<job>"       sk = "attempt#<submit epoch>" a Slurm job's attempt (its events)
                      pk = "slurm-running"         sk = "<job name>"             the running attempt
    press_reports     pk = "press-report#<press>"  sk = "press-report"           a failed Slack press posted back

"""

from __future__ import annotations

from typing import Any

SECONDS_PER_DAY = 86_400
NOT_EXISTS = "attribute_not_exists(pk)"
BATCH_GET_LIMIT = 100  # BatchGetItem keys per call


def job_key(platform: str, job: str) -> str:
    """A job's partition key: ``job#<platform>#<name>``."""
    return f"job#{platform}#{job}"


class Store:
    """The table, through the low-level DynamoDB client (no float/Decimal conversions: JSON is kept as strings)."""

    def __init__(self, dynamodb: Any, table: str, ttl_days: int) -> None:
        self.dynamodb = dynamodb
        self.table = table
        self.ttl_seconds = ttl_days * SECONDS_PER_DAY

    def expires(self, now: float) -> dict[str, str]:
        """An item's TTL attribute value, written at `now`."""
        return {"N": str(int(now + self.ttl_seconds))}

    def batch_get(self, keys: list[str], sk: str) -> dict[str, dict[str, Any]]:
        """The items of sort key `sk` in the partitions `keys`, by partition key: 100 keys per BatchGetItem call."""
        found: dict[str, dict[str, Any]] = {}
        for offset in range(0, len(keys), BATCH_GET_LIMIT):
            chunk = keys[offset : offset + BATCH_GET_LIMIT]
            request = {self.table: {"Keys": [{"pk": {"S": k}, "sk": {"S": sk}} for k in chunk], "ConsistentRead": True}}
            while request:
                response = self.dynamodb.batch_get_item(RequestItems=request)
                for item in response["Responses"].get(self.table, []):
                    found[item["pk"]["S"]] = item
                request = response.get("UnprocessedKeys") or {}
        return found

    def first_items(self, pk: str, limit: int) -> list[dict[str, Any]]:
        """The first `limit` items of a shared partition (pending posts, resume tries, progress watches)."""
        return self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
            ConsistentRead=True,
            Limit=limit,
        )["Items"]
