"""What follows one of Stallwatch's stops, in the table: its once-only claim, and the resume while it is tried.

    pk = "job#sagemaker#my-job"  sk = "resume#<stop at>"      the claim on what follows the stop (a resume, or the
                                                             alert that there is none)
    pk = "resume-retry"          sk = "<stop at>#<job key>"   a resume being tried: its plan, tries, next try

One partition for every resume being tried: the stopped job is no longer listed as running, and one Query a sweep
finds them all. Empty unless a resume is in flight or failed for a reason a later try can fix.

    tries = ResumeTries(store)
    audit_sk = tries.claim(key, stop_at, audit, now, retry, hold_until)    # None: a duplicated event
    for retry in tries.oldest(10): ...
    audit_sk = tries.claim_try(retry, audit, now, hold_s)                  # None: another sweep has it
    tries.finish_try(retry, audit_sk, outcome, next_at)                    # next_at None: done
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.store import Store
from stallwatch.core.resume import ResumePlan

RESUME_RETRY_PK = "resume-retry"
RESUME_SK_PREFIX = "resume#"


@dataclass(frozen=True)
class ResumeRetry:
    """A resume's tries: the first (on_job_state) and, after a transient failure, the sweeper's
    (`runtime.resume_retry`). Every try starts the same attempt: `plan` as the first try made it."""

    job_key: str  # the stopped job
    stop_at: float  # Stallwatch's stop that the resume follows
    plan: ResumePlan
    first_at: float
    audit: dict[str, Any] = field(default_factory=dict)  # what every try's audit record repeats (job, attempt, ...)
    thread_ts: str | None = None  # the stop message, for the follow-ups' thread (bot mode)
    tries: int = 1  # tries taken so far, the one in flight included
    next_at: float = 0.0  # when the next try is due
    post: dict[str, str] | None = None  # the "retrying" message ({"channel", "ts"}, bot mode): later tries update it

    @property
    def sk(self) -> str:
        return f"{self.stop_at:017.3f}#{self.job_key}"

    def with_tries(self, tries: int) -> ResumeRetry:
        return replace(self, tries=tries)


class ResumeTries:
    """The resume claims and the resumes being tried, in the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.audit = AuditTrail(store)

    def claim(
        self,
        key: str,
        stop_at: float,
        audit: dict[str, Any],
        now: float,
        tries: ResumeRetry | None = None,
        hold_until: float = 0.0,
    ) -> str | None:
        """Claim what follows Stallwatch's stop at `stop_at` (a resume, or the alert that there is none) and audit
        it, in one transaction; the audit record's sort key, or None if claimed before (a duplicated event).
        A resume's `tries` item goes in the same transaction, held by this invocation until `hold_until`: if it
        dies before its call, the sweeper tries once the hold has run out, so no resume is lost."""
        also = []
        if tries is not None:
            item = self._retry_item(tries, now) | {"claimed_until": {"N": f"{hold_until:.3f}"}}
            also.append({"Put": {"TableName": self.store.table, "Item": item}})
        return self.audit.claim(key, f"{RESUME_SK_PREFIX}{stop_at:017.3f}", audit, now, also)

    def claims(self, key: str) -> int:
        """How many of a job's stops were followed up (its resumes, for a job that restarts under its own name)."""
        return len(self.audit.records(key, RESUME_SK_PREFIX.rstrip("#")))

    def _retry_item(self, retry: ResumeRetry, now: float) -> dict[str, Any]:
        fixed = {k: v for k, v in asdict(retry).items() if k not in ("tries", "next_at", "post")}
        return {
            "pk": {"S": RESUME_RETRY_PK},
            "sk": {"S": retry.sk},
            "retry": {"S": json.dumps(fixed)},
            "tries": {"N": str(retry.tries)},
            "next_at": {"N": f"{retry.next_at:.3f}"},
            "expires_at": self.store.expires(now),
        }

    def oldest(self, limit: int) -> list[ResumeRetry]:
        """The oldest `limit` resumes being tried (their sort key starts with the stop's time)."""
        retries = []
        for item in self.store.first_items(RESUME_RETRY_PK, limit):
            fixed = json.loads(item["retry"]["S"])
            fixed["plan"] = ResumePlan(**fixed["plan"])
            post = json.loads(item["post"]["S"]) if "post" in item else None
            tries, next_at = int(item["tries"]["N"]), float(item["next_at"]["N"])
            retries.append(ResumeRetry(**fixed, tries=tries, next_at=next_at, post=post))
        return retries

    def claim_try(self, retry: ResumeRetry, audit: dict[str, Any], now: float, hold_s: float) -> str | None:
        """Take the next try of a resume, and audit it, in one transaction: only if it is due, no one took a try
        since it was read and no hold is live, so two sweeper runs never try at once. The audit record's sort key,
        or None if another run has it."""
        audit_sk = f"audit#{now:017.3f}#resume-retry"
        update = {
            "TableName": self.store.table,
            "Key": {"pk": {"S": RESUME_RETRY_PK}, "sk": {"S": retry.sk}},
            "UpdateExpression": "SET tries = :next, claimed_until = :until",
            "ConditionExpression": (
                "tries = :seen AND next_at <= :now AND (attribute_not_exists(claimed_until) OR claimed_until < :now)"
            ),
            "ExpressionAttributeValues": {
                ":seen": {"N": str(retry.tries)},
                ":next": {"N": str(retry.tries + 1)},
                ":until": {"N": f"{now + hold_s:.3f}"},
                ":now": {"N": f"{now:.3f}"},
            },
        }
        dynamodb = self.store.dynamodb
        try:
            dynamodb.transact_write_items(
                TransactItems=[{"Update": update}, self.audit.put(retry.job_key, audit_sk, audit, now)]
            )
        except dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def finish_try(
        self,
        retry: ResumeRetry,
        audit_sk: str,
        outcome: dict[str, Any],
        next_at: float | None,
        post: dict[str, str] | None = None,
    ) -> None:
        """After a try: its audit outcome and, in the same transaction, the resume released for its next try at
        `next_at` (with the "retrying" message to update, `post`), or (None) removed: started, failed for good, or
        given up."""
        key = {"pk": {"S": RESUME_RETRY_PK}, "sk": {"S": retry.sk}}
        retry_change: dict[str, Any]
        if next_at is None:
            retry_change = {"Delete": {"TableName": self.store.table, "Key": key}}
        else:
            values = {":next": {"N": f"{next_at:.3f}"}}
            if post:
                values[":post"] = {"S": json.dumps(post)}
            sets = "SET next_at = :next" + (", post = :post" if post else "")
            retry_change = {
                "Update": {
                    "TableName": self.store.table,
                    "Key": key,
                    "UpdateExpression": f"{sets} REMOVE claimed_until",
                    "ExpressionAttributeValues": values,
                }
            }
        self.store.dynamodb.transact_write_items(
            TransactItems=[{"Update": self.audit.outcome_update(retry.job_key, audit_sk, outcome)}, retry_change]
        )
