"""DynamoDB memory of the control plane: job state, incidents, the audit trail and event idempotency.

One table, partition key ``pk``, sort key ``sk``, TTL attribute ``expires_at``:

    pk = "job#sagemaker#my-job"  sk = "state"                  JobState (JSON), version, open incident,
                                                              unfinished decision, failed-stop message, claim
    pk = "job#sagemaker#my-job"  sk = "alarms"                 how many of the job's alarms are in place
    pk = "job#sagemaker#my-job"  sk = "incident#<opened_at>"   status open/closed, diagnosis, actions
    pk = "job#sagemaker#my-job"  sk = "audit#<at>#<key>"        one record per decision, then its outcome
    pk = "event#<dedup key>"     sk = "event"                  an alarm transition already handled
    pk = "pending-post"          sk = "<audit sk>#<job key>"   a Slack message not delivered yet, and its attempts
    pk = "job#sagemaker#my-job"  sk = "resume#<stop at>"        the claim on resuming after one of Stallwatch's stops
    pk = "job#sagemaker#my-job"  sk = "summary"                 the claim on a run's end-of-run Slack summary
    pk = "resume-watch"          sk = "<job key>"               a resumed job whose progress Slack has not heard yet
    pk = "resume-retry"          sk = "<stop at>#<job key>"     a resume being tried (the sweeper retries a failure)
    pk = "job#ec2#my-job"        sk = "recover#<stall since>"   the claim on recovering one stall in place
    pk = "recovery"              sk = "<started at>#<job key>"  a recovery in place under way (aws.recoveries)
    pk = "press-report#<press>"  sk = "press-report"           a failed Slack press posted back (aws.press_reports)

A decision is committed in one transaction (state at the version it was read + audit record + event claim),
so a duplicated event or a concurrent decision on the same job loses the race and acts on nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from stallwatch.aws.observability import logger
from stallwatch.core import record_budget
from stallwatch.core.decision import JobState
from stallwatch.core.resume import ResumePlan, StopRecord, stop_of

STATE_SK = "state"
ALARMS_SK = "alarms"  # the job's alarms are in place (how many, since when)
EVENT_SK = "event"
# One partition for every undelivered Slack message: the sweeper reads it with one Query, and finds the posts of jobs
# that have ended too (their state item is deleted and they are no longer listed as running). Empty unless Slack failed.
PENDING_POST_PK = "pending-post"
SECONDS_PER_DAY = 86_400
RESUME_WATCH_PK = "resume-watch"
# One partition for every resume being tried: the stopped job is no longer listed as running, and one Query a sweep
# finds them all. Empty unless a resume is in flight or failed for a reason a later try can fix.
RESUME_RETRY_PK = "resume-retry"
ALARM_AUDIT_PK = "alarm-audit"  # when the sweeper last listed every alarm
NOT_EXISTS = "attribute_not_exists(pk)"
RESUME_SK_PREFIX = "resume#"
BATCH_GET_LIMIT = 100  # BatchGetItem keys per call
CHANGE_ATTEMPTS = 3  # a concurrent decision on the same job may win a commit; read again and retry
# An audit record's JSON at most (DynamoDB's item is 400 KB): its outcome, keys and the incident's reasons fit beside
AUDIT_BYTES = 200_000


class ConcurrentDecisionError(RuntimeError):
    """The job's state changed since it was read, or the event was already handled: nothing was written."""


class AlreadyHandledError(ConcurrentDecisionError):
    """The event (a Slack request, a CLI call) was claimed before: a replay, nothing was written."""


@dataclass(frozen=True)
class PendingPost:
    """A Slack message that was not delivered, as read from its `pending-post` item."""

    sk: str
    job_key: str
    audit_sk: str  # the decision whose outcome the attempts are added to
    message: dict[str, Any]  # the rendered message, posted again as it was
    outcome: dict[str, Any]  # the audit record's outcome so far (stop result, Slack attempts)
    attempts: int  # posts tried so far, the first one included


@dataclass(frozen=True)
class Provisioned:
    """A job's alarm marker: `put` of its `alarms` are in place."""

    put: int
    alarms: int

    @property
    def complete(self) -> bool:
        return self.put >= self.alarms


@dataclass(frozen=True)
class ProgressWatch:
    """A resumed job, watched until it passes the step its run had reached (then Slack hears how long it took)."""

    job_key: str  # the resumed job (its audit trail gets the follow-up)
    best_step: float
    restarted_at: float
    thread_ts: str | None = None


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


def job_key(platform: str, job: str) -> str:
    return f"job#{platform}#{job}"


@dataclass(frozen=True)
class StoredState:
    """A job's state as read, with what the store needs to write it back safely."""

    state: JobState = field(default_factory=JobState)
    version: int = 0
    incident: str | None = None  # sort key of the open incident
    updated_at: float | None = None  # when the last decision was committed
    # The failed-stop message of this incident ({"channel", "ts", "failures"}): later failures update it in place.
    stop_post: dict[str, Any] | None = None
    # A decision committed but not yet acted on ({"audit", "before"}): set by `commit(acting=True)`, removed by
    # `finish_decision`. One left behind (its Lambda timed out) is completed by the sweeper.
    unfinished: dict[str, Any] | None = None

    def before_unfinished(self) -> StoredState:
        """The state as it was before the unfinished decision, to decide again from (same version)."""
        if not self.unfinished:
            return self
        before = _state_from_json(self.unfinished["before"])
        return StoredState(before, self.version, self.incident, self.updated_at, self.stop_post)


def _state_to_json(state: JobState) -> str:
    return json.dumps(asdict(state))


def _state_from_json(raw: str) -> JobState:
    data = json.loads(raw)
    data["alerted"] = tuple(data.get("alerted", ()))
    data["stragglers"] = tuple(data.get("stragglers", ()))
    if data.get("warning") is not None:
        data["warning"] = tuple(data["warning"])
    return JobState(**data)


class Store:
    """The table, through the low-level DynamoDB client (no float/Decimal conversions: state is JSON)."""

    def __init__(self, dynamodb: Any, table: str, ttl_days: int) -> None:
        self.dynamodb = dynamodb
        self.table = table
        self.ttl_seconds = ttl_days * SECONDS_PER_DAY

    def _expires(self, now: float) -> dict[str, str]:
        return {"N": str(int(now + self.ttl_seconds))}

    def load(self, key: str) -> StoredState:
        item = self.dynamodb.get_item(
            TableName=self.table, Key={"pk": {"S": key}, "sk": {"S": STATE_SK}}, ConsistentRead=True
        ).get("Item")
        return _stored(item) if item else StoredState()

    def claim_decision(
        self,
        key: str,
        now: float,
        hold_seconds: float,
        undecided_since: float | None = None,
    ) -> StoredState | None:
        """Claim the job for one decision and read its state, in one call: None if another invocation holds a
        claim (it reads the job's signals now, or decided less than `hold_seconds` ago), so the alarms of one job
        firing together cost one signal read. The commit keeps or replaces the claim; an invocation that dies
        before committing lets it run out. `undecided_since` (a recheck's time): None only if a decision was
        committed at or after it, whatever claim is held (a concurrent decision still commits once: `commit`). A
        job without a state item gets one: the caller has checked that the job exists (`decide.handle_alarm`)."""
        if undecided_since is None:
            condition = "attribute_not_exists(claimed_until) OR claimed_until < :now"
            values = {":now": {"N": f"{now:.3f}"}}
        else:
            condition = "attribute_not_exists(updated_at) OR updated_at < :since"
            values = {":since": {"N": f"{undecided_since:.3f}"}}
        return self._claim(key, now, now + hold_seconds, condition, values)

    def claim_wake(self, key: str, now: float, since: float, start: float, hold_seconds: float) -> StoredState | None:
        """Claim the job for a fatal line's decision, beginning at `start`, in one call: None if a decision that
        begins (or began) at or after `since` (when a decision sees the line) holds the claim or was committed: it
        sees the line, so a burst of lines wakes one decision. A claim held by a decision that began before `since`
        does not swallow the line: it is taken over (the commit of the two that loses decides again), as is one that
        ran out. A job without a state item gets one: the caller has checked that the job exists (`runtime.wake`)."""
        condition = (
            "(attribute_not_exists(claimed_until) OR claimed_until < :now OR claimed_until < :unseen)"
            " AND (attribute_not_exists(updated_at) OR updated_at < :since)"
        )
        values = {
            ":now": {"N": f"{now:.3f}"},
            ":unseen": {"N": f"{since + hold_seconds:.3f}"},  # a claim's decision began `hold_seconds` before its end
            ":since": {"N": f"{since:.3f}"},
        }
        return self._claim(key, now, start + hold_seconds, condition, values)

    def line_seen(self, key: str, now: float, since: float, hold_seconds: float) -> bool:
        """Whether `claim_wake` would coalesce the line (a decision that begins, or began, at or after `since` holds
        the claim or was committed), from one consistent GetItem of two attributes: the look a burst's deliveries take
        before they read the job. False for a job without a state item."""
        item = self.dynamodb.get_item(
            TableName=self.table,
            Key={"pk": {"S": key}, "sk": {"S": STATE_SK}},
            ConsistentRead=True,
            ProjectionExpression="claimed_until, updated_at",
        ).get("Item", {})
        claimed_until = float(item["claimed_until"]["N"]) if "claimed_until" in item else None
        updated_at = float(item["updated_at"]["N"]) if "updated_at" in item else None
        # compared as `claim_wake` compares them: at the table's millisecond
        at, seen, unseen = (float(f"{t:.3f}") for t in (now, since, since + hold_seconds))
        held = claimed_until is not None and claimed_until >= max(at, unseen)
        return held or (updated_at is not None and updated_at >= seen)

    def _claim(self, key: str, now: float, until: float, condition: str, values: dict[str, Any]) -> StoredState | None:
        """Set the job's claim until `until` where `condition` holds (the state as read), else None."""
        try:
            response = self.dynamodb.update_item(
                TableName=self.table,
                Key={"pk": {"S": key}, "sk": {"S": STATE_SK}},
                UpdateExpression="SET claimed_until = :until, expires_at = if_not_exists(expires_at, :expires)",
                ConditionExpression=condition,
                ExpressionAttributeValues={**values, ":until": {"N": f"{until:.3f}"}, ":expires": self._expires(now)},
                ReturnValues="ALL_NEW",
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            return None
        return _stored(response["Attributes"])

    def release_claim(self, key: str) -> None:
        """Give back a claim taken for a job that will not be decided (gone, or ended): the item it created, if
        no decision was ever committed, goes; otherwise only the claim."""
        item_key = {"pk": {"S": key}, "sk": {"S": STATE_SK}}
        try:
            self.dynamodb.delete_item(
                TableName=self.table, Key=item_key, ConditionExpression="attribute_not_exists(version)"
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            self.dynamodb.update_item(TableName=self.table, Key=item_key, UpdateExpression="REMOVE claimed_until")

    def provisioned(self, keys: list[str]) -> dict[str, Provisioned]:
        """How many of their alarms the jobs (of `keys`) have in place, from their markers (jobs without one have
        none): 100 keys per BatchGetItem call."""
        return {
            key: Provisioned(int(item["put"]["N"]), int(item["alarms"]["N"]))
            for key, item in self._batch_get(keys, ALARMS_SK).items()
        }

    def mark_provisioned(self, key: str, put: int, alarms: int, now: float) -> None:
        """Remember how many of the job's alarms are in place, so the sweeper need not list alarms to know."""
        item = {
            "pk": {"S": key},
            "sk": {"S": ALARMS_SK},
            "put": {"N": str(put)},
            "alarms": {"N": str(alarms)},
            "at": {"N": f"{now:.3f}"},
            "expires_at": self._expires(now),
        }
        self.dynamodb.put_item(TableName=self.table, Item=item)

    def forget_provisioned(self, key: str) -> None:
        """Drop the job's alarm marker; a job that never had one is not written to."""
        with contextlib.suppress(self.dynamodb.exceptions.ConditionalCheckFailedException):
            self.dynamodb.delete_item(
                TableName=self.table,
                Key={"pk": {"S": key}, "sk": {"S": ALARMS_SK}},
                ConditionExpression="attribute_exists(pk)",
            )

    def _batch_get(self, keys: list[str], sk: str) -> dict[str, dict[str, Any]]:
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

    def load_many(self, keys: list[str]) -> dict[str, StoredState]:
        """States of many jobs, 100 keys per BatchGetItem call; jobs never seen get an empty state."""
        found = self._batch_get(keys, STATE_SK)
        return {key: _stored(found[key]) if key in found else StoredState() for key in keys}

    def commit(
        self,
        key: str,
        read: StoredState,
        written: StoredState,
        audit: dict[str, Any],
        now: float,
        event_key: str | None = None,
        close_incident: str | None = None,
        acting: bool = False,
        hold_until: float | None = None,
    ) -> str:
        """Write the new state (if still at the version read), its audit record, the event claim, and the opened
        or closed incident, atomically. Returns the audit record's sort key; `ConcurrentDecisionError` if lost.
        `acting`: actions follow, so the decision is marked unfinished until `finish_decision`. `hold_until` keeps
        the job's claim (`claim_decision`) after the decision, so an alarm burst is decided once."""
        audit_sk = f"audit#{now:017.3f}#{event_key or 'sweep'}"
        expires = self._expires(now)
        state_item = {
            "pk": {"S": key},
            "sk": {"S": STATE_SK},
            "state": {"S": _state_to_json(written.state)},
            "version": {"N": str(read.version + 1)},
            "updated_at": {"N": f"{now:.3f}"},
            "expires_at": expires,
        }
        if written.incident:
            state_item["incident"] = {"S": written.incident}
        if written.stop_post:
            state_item["stop_post"] = {"S": json.dumps(written.stop_post)}
        if acting:
            unfinished = {"audit": audit_sk, "before": _state_to_json(read.state)}
            state_item["unfinished"] = {"S": json.dumps(unfinished)}
        if hold_until is not None:
            state_item["claimed_until"] = {"N": f"{hold_until:.3f}"}
        # a first decision's item may already hold its claim (`claim_decision`), never a version
        condition = "attribute_not_exists(version)" if read.version == 0 else "version = :v"
        put_state: dict[str, Any] = {"TableName": self.table, "Item": state_item, "ConditionExpression": condition}
        if read.version:
            put_state["ExpressionAttributeValues"] = {":v": {"N": str(read.version)}}
        items: list[dict[str, Any]] = [
            {"Put": put_state},
            {"Put": {"TableName": self.table, "Item": _audit_item(key, audit_sk, audit, expires)}},
        ]
        if event_key:
            event_item = {"pk": {"S": f"event#{event_key}"}, "sk": {"S": EVENT_SK}, "expires_at": expires}
            condition = "attribute_not_exists(pk)"
            items.append({"Put": {"TableName": self.table, "Item": event_item, "ConditionExpression": condition}})
        if written.incident and written.incident != read.incident:
            incident = _incident_item(key, written.incident, audit, now, expires)
            items.append({"Put": {"TableName": self.table, "Item": incident}})
        if close_incident:
            items.append({"Update": self._close(key, close_incident, audit.get("diagnosis", "healthy"), now)})
        try:
            self.dynamodb.transact_write_items(TransactItems=items)
        except self.dynamodb.exceptions.TransactionCanceledException as exc:
            reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
            raise ConcurrentDecisionError(f"decision on {key} not committed: {reasons}") from exc
        return audit_sk

    def claim_event(self, event_key: str, now: float, hold_seconds: float) -> bool:
        """Claim `event_key` (a Slack request) for `hold_seconds`; False if it was claimed before (a replay)."""
        expires = {"N": str(int(now + hold_seconds))}
        item = {"pk": {"S": f"event#{event_key}"}, "sk": {"S": EVENT_SK}, "expires_at": expires}
        try:
            self.dynamodb.put_item(TableName=self.table, Item=item, ConditionExpression="attribute_not_exists(pk)")
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def claim_alarm_audit(self, now: float, every_seconds: float) -> bool:
        """True for the one sweep that may list every alarm now: none did in the last `every_seconds`."""
        try:
            self.dynamodb.update_item(
                TableName=self.table,
                Key={"pk": {"S": ALARM_AUDIT_PK}, "sk": {"S": ALARM_AUDIT_PK}},
                UpdateExpression="SET audited_at = :now",
                ConditionExpression="attribute_not_exists(audited_at) OR audited_at <= :due",
                ExpressionAttributeValues={":now": {"N": str(now)}, ":due": {"N": str(now - every_seconds)}},
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def change_state(
        self, key: str, change: Callable[[JobState], JobState], audit: dict[str, Any], now: float, event_key: str
    ) -> tuple[JobState, str]:
        """Write `change(state)`, its audit record and the claim on `event_key` in one transaction; returns the new
        state and the audit record's sort key. A concurrent decision makes it read again; a second use of
        `event_key` raises `AlreadyHandledError`. (The Slack buttons and `stallwatch snooze` change a job's state
        this way.)"""
        for _ in range(CHANGE_ATTEMPTS):
            read = self.load(key)
            written = StoredState(change(read.state), read.version, read.incident)
            try:
                return written.state, self.commit(key, read, written, audit, now, event_key=event_key)
            except ConcurrentDecisionError:
                claim = {"pk": {"S": f"event#{event_key}"}, "sk": {"S": EVENT_SK}}
                if "Item" in self.dynamodb.get_item(TableName=self.table, Key=claim, ConsistentRead=True):
                    raise AlreadyHandledError(f"request {event_key} was already handled") from None
        raise ConcurrentDecisionError(f"{key}: the state kept changing; gave up after {CHANGE_ATTEMPTS} attempts")

    def expires(self, now: float) -> dict[str, str]:
        """An item's TTL attribute value, for the stores of other kinds of items in this table (`aws.recoveries`)."""
        return self._expires(now)

    def audit_put(self, key: str, sk: str, audit: dict[str, Any], now: float) -> dict[str, Any]:
        """A transaction's Put of an audit record."""
        return {"Put": {"TableName": self.table, "Item": _audit_item(key, sk, audit, self._expires(now))}}

    def record_outcome(self, key: str, audit_sk: str, outcome: dict[str, Any]) -> None:
        """Add what acting did (stop result, Slack result) to the decision's audit record."""
        self.dynamodb.update_item(**self._set_outcome(key, audit_sk, outcome))

    def _set_outcome(self, key: str, audit_sk: str, outcome: dict[str, Any]) -> dict[str, Any]:
        return {
            "TableName": self.table,
            "Key": {"pk": {"S": key}, "sk": {"S": audit_sk}},
            "UpdateExpression": "SET outcome = :o",
            "ExpressionAttributeValues": {":o": {"S": json.dumps(outcome, default=str)}},
        }

    def record_unsent_post(
        self, key: str, audit_sk: str, outcome: dict[str, Any], message: dict[str, Any], now: float
    ) -> None:
        """`record_outcome` for a message (a resume follow-up, a run summary) whose Slack post failed: the message is
        kept for the sweeper to post again, in the same transaction (one call, as for a delivered post)."""
        pending = self._pending(key, audit_sk, outcome, message, now)
        self.dynamodb.transact_write_items(
            TransactItems=[
                {"Update": self._set_outcome(key, audit_sk, outcome)},
                {"Put": {"TableName": self.table, "Item": pending}},
            ]
        )

    def finish_decision(
        self,
        key: str,
        audit_sk: str,
        outcome: dict[str, Any],
        written: StoredState,
        now: float,
        release_stop: bool = False,
        unsent_message: dict[str, Any] | None = None,
    ) -> None:
        """After acting on a decision committed with `acting=True`, one transaction: the audit outcome; on the state
        item, if still at the version the commit wrote, the unfinished mark removed, `written.stop_post` kept and a
        failed stop released (`stopped_at` cleared) for the sweeper to retry; and a message Slack did not take, kept
        for the sweeper to post again. A state that moved on since (a newer decision, an operator's snooze, the job's
        end) wins: then only the outcome and the message are written."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {":v": {"N": str(written.version + 1)}}
        sets, removes = [], ["unfinished"]
        if written.stop_post:
            sets.append("stop_post = :p")
            values[":p"] = {"S": json.dumps(written.stop_post)}
        else:
            removes.append("stop_post")
        if release_stop:
            sets.append("#s = :s")
            names["#s"] = "state"
            values[":s"] = {"S": _state_to_json(written.state.with_(stopped_at=None))}
        expression = (f"SET {', '.join(sets)} " if sets else "") + f"REMOVE {', '.join(removes)}"
        if release_stop:
            expression += " ADD version :one"
            values[":one"] = {"N": "1"}
        state_update: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"pk": {"S": key}, "sk": {"S": STATE_SK}},
            "UpdateExpression": expression,
            "ConditionExpression": "version = :v",
            "ExpressionAttributeValues": values,
        }
        if names:
            state_update["ExpressionAttributeNames"] = names
        items: list[dict[str, Any]] = [{"Update": self._set_outcome(key, audit_sk, outcome)}]
        if unsent_message is not None:
            pending = self._pending(key, audit_sk, outcome, unsent_message, now)
            items.append({"Put": {"TableName": self.table, "Item": pending}})
        try:
            self.dynamodb.transact_write_items(TransactItems=[*items, {"Update": state_update}])
        except self.dynamodb.exceptions.TransactionCanceledException:
            logger.info("the job's state moved on since the decision: only its outcome is recorded", extra={"job": key})
            self.dynamodb.transact_write_items(TransactItems=items)

    def _pending(
        self, key: str, audit_sk: str, outcome: dict[str, Any], message: dict[str, Any], now: float
    ) -> dict[str, Any]:
        return {
            "pk": {"S": PENDING_POST_PK},
            "sk": {"S": f"{audit_sk}#{key}"},
            "job_key": {"S": key},
            "audit_sk": {"S": audit_sk},
            "message": {"S": json.dumps(message)},
            "outcome": {"S": json.dumps(outcome, default=str)},
            "attempts": {"N": "1"},
            "expires_at": self._expires(now),
        }

    def _first_items(self, pk: str, limit: int) -> list[dict[str, Any]]:
        """The first `limit` items of a shared partition (pending posts, resume tries, progress watches)."""
        return self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
            ConsistentRead=True,
            Limit=limit,
        )["Items"]

    def pending_posts(self, limit: int) -> list[PendingPost]:
        """The oldest `limit` undelivered Slack messages (their sort key starts with the decision's time)."""
        items = self._first_items(PENDING_POST_PK, limit)
        return [
            PendingPost(
                sk=item["sk"]["S"],
                job_key=item["job_key"]["S"],
                audit_sk=item["audit_sk"]["S"],
                message=json.loads(item["message"]["S"]),
                outcome=json.loads(item["outcome"]["S"]),
                attempts=int(item["attempts"]["N"]),
            )
            for item in items
        ]

    def claim_post(self, post: PendingPost, now: float, hold_seconds: float) -> bool:
        """Take the next attempt at a pending post: only if no one took an attempt since it was read and no claim
        is held, so two sweeper runs never post one message twice. False if another run has it."""
        try:
            self.dynamodb.update_item(
                TableName=self.table,
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
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def finish_post(self, post: PendingPost, outcome: dict[str, Any], keep: bool) -> None:
        """After an attempt: the audit outcome updated and, in the same transaction, the pending post released for
        the next attempt (`keep`) or removed (delivered, or given up)."""
        pending_key = {"pk": {"S": PENDING_POST_PK}, "sk": {"S": post.sk}}
        if keep:
            pending: dict[str, Any] = {
                "Update": {
                    "TableName": self.table,
                    "Key": pending_key,
                    "UpdateExpression": "SET outcome = :o REMOVE claimed_until",
                    "ExpressionAttributeValues": {":o": {"S": json.dumps(outcome, default=str)}},
                }
            }
        else:
            pending = {"Delete": {"TableName": self.table, "Key": pending_key}}
        self.dynamodb.transact_write_items(
            TransactItems=[{"Update": self._set_outcome(post.job_key, post.audit_sk, outcome)}, pending]
        )

    def claim_resume(
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
            also.append({"Put": {"TableName": self.table, "Item": item}})
        return self.claim(key, f"{RESUME_SK_PREFIX}{stop_at:017.3f}", audit, now, also)

    def claim(
        self, key: str, sk: str, audit: dict[str, Any], now: float, also: list[dict[str, Any]] | None = None
    ) -> str | None:
        """Claim a once-only step of a job (item `sk`) and audit it (and write `also`), in one transaction; the
        audit record's sort key, or None if claimed before."""
        audit_sk = f"audit#{now:017.3f}#{sk.split('#', 1)[0]}"
        expires = self._expires(now)
        claim = {"pk": {"S": key}, "sk": {"S": sk}, "expires_at": expires}
        try:
            self.dynamodb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": self.table, "Item": claim, "ConditionExpression": NOT_EXISTS}},
                    {"Put": {"TableName": self.table, "Item": _audit_item(key, audit_sk, audit, expires)}},
                    *(also or []),
                ]
            )
        except self.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def _retry_item(self, retry: ResumeRetry, now: float) -> dict[str, Any]:
        fixed = {k: v for k, v in asdict(retry).items() if k not in ("tries", "next_at", "post")}
        return {
            "pk": {"S": RESUME_RETRY_PK},
            "sk": {"S": retry.sk},
            "retry": {"S": json.dumps(fixed)},
            "tries": {"N": str(retry.tries)},
            "next_at": {"N": f"{retry.next_at:.3f}"},
            "expires_at": self._expires(now),
        }

    def resume_retries(self, limit: int) -> list[ResumeRetry]:
        """The oldest `limit` resumes being tried (their sort key starts with the stop's time)."""
        items = self._first_items(RESUME_RETRY_PK, limit)
        retries = []
        for item in items:
            fixed = json.loads(item["retry"]["S"])
            fixed["plan"] = ResumePlan(**fixed["plan"])
            post = json.loads(item["post"]["S"]) if "post" in item else None
            tries, next_at = int(item["tries"]["N"]), float(item["next_at"]["N"])
            retries.append(ResumeRetry(**fixed, tries=tries, next_at=next_at, post=post))
        return retries

    def claim_resume_try(self, retry: ResumeRetry, audit: dict[str, Any], now: float, hold_s: float) -> str | None:
        """Take the next try of a resume, and audit it, in one transaction: only if it is due, no one took a try
        since it was read and no hold is live, so two sweeper runs never try at once. The audit record's sort key,
        or None if another run has it."""
        audit_sk = f"audit#{now:017.3f}#resume-retry"
        update = {
            "TableName": self.table,
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
        audit_item = _audit_item(retry.job_key, audit_sk, audit, self._expires(now))
        try:
            self.dynamodb.transact_write_items(
                TransactItems=[{"Update": update}, {"Put": {"TableName": self.table, "Item": audit_item}}]
            )
        except self.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def finish_resume_try(
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
            retry_change = {"Delete": {"TableName": self.table, "Key": key}}
        else:
            values = {":next": {"N": f"{next_at:.3f}"}}
            if post:
                values[":post"] = {"S": json.dumps(post)}
            sets = "SET next_at = :next" + (", post = :post" if post else "")
            retry_change = {
                "Update": {
                    "TableName": self.table,
                    "Key": key,
                    "UpdateExpression": f"{sets} REMOVE claimed_until",
                    "ExpressionAttributeValues": values,
                }
            }
        self.dynamodb.transact_write_items(
            TransactItems=[{"Update": self._set_outcome(retry.job_key, audit_sk, outcome)}, retry_change]
        )

    def resume_claims(self, key: str) -> int:
        """How many of a job's stops were followed up (its resumes, for a job that restarts under its own name)."""
        return len(self.records(key, RESUME_SK_PREFIX.rstrip("#")))

    def watch_progress(self, watch: ProgressWatch, now: float) -> None:
        item = {
            "pk": {"S": RESUME_WATCH_PK},
            "sk": {"S": watch.job_key},
            "watch": {"S": json.dumps(asdict(watch))},
            "expires_at": self._expires(now),
        }
        self.dynamodb.put_item(TableName=self.table, Item=item)

    def progress_watches(self, limit: int) -> list[ProgressWatch]:
        items = self._first_items(RESUME_WATCH_PK, limit)
        return [ProgressWatch(**json.loads(item["watch"]["S"])) for item in items]

    def end_watch(self, watch: ProgressWatch, audit: dict[str, Any] | None, now: float) -> str | None:
        """Remove a watch and, in the same transaction, audit why on the resumed job (`audit`, if any). The audit
        record's sort key ("" without one), or None if another run removed the watch first (so only one posts)."""
        audit_sk = f"audit#{now:017.3f}#progress" if audit is not None else ""
        items: list[dict[str, Any]] = [
            {
                "Delete": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": RESUME_WATCH_PK}, "sk": {"S": watch.job_key}},
                    "ConditionExpression": "attribute_exists(pk)",
                }
            }
        ]
        if audit is not None:
            item = _audit_item(watch.job_key, audit_sk, audit, self._expires(now))
            items.append({"Put": {"TableName": self.table, "Item": item}})
        try:
            self.dynamodb.transact_write_items(TransactItems=items)
        except self.dynamodb.exceptions.TransactionCanceledException:
            return None
        return audit_sk

    def release_stop(self, key: str, state: JobState, version: int | None = None, forget_stall: bool = False) -> bool:
        """Forget a stop that failed, so the sweeper tries again: `state` is the state the stop committed, and
        `version` the version it was written at (when the caller knows it). `forget_stall`: the stall is over too
        (a restart in place brought steps), so a later one is warned anew.

        Only if the job's state item still holds exactly that: a decision or an operator action committed since
        (a snooze, say) is newer and wins, and a job whose state was cleared (`close_job`) is not brought back.
        True if the stop was released."""
        condition = "attribute_exists(pk) AND #s = :written"
        over = {"warned_at": None, "warning": None, "stall_since": None, "stall_from": None} if forget_stall else {}
        values = {
            ":written": {"S": _state_to_json(state)},
            ":s": {"S": _state_to_json(state.with_(stopped_at=None, **over))},
            ":one": {"N": "1"},
        }
        if version is not None:
            condition += " AND version = :v"
            values[":v"] = {"N": str(version)}
        try:
            self.dynamodb.update_item(
                TableName=self.table,
                Key={"pk": {"S": key}, "sk": {"S": STATE_SK}},
                UpdateExpression="SET #s = :s ADD version :one",
                ConditionExpression=condition,
                ExpressionAttributeNames={"#s": "state"},
                ExpressionAttributeValues=values,
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            logger.info("stop not released: the job's state changed or was cleared since", extra={"job": key})
            return False
        return True

    def close_job(self, key: str, reason: str, now: float) -> bool:
        """The job ended: close its open incident and clear its state. True if an incident was closed."""
        item = self.dynamodb.get_item(TableName=self.table, Key={"pk": {"S": key}, "sk": {"S": STATE_SK}}).get("Item")
        if not item:
            return False
        stored = _stored(item)
        items: list[dict[str, Any]] = [
            {"Delete": {"TableName": self.table, "Key": {"pk": {"S": key}, "sk": {"S": STATE_SK}}}}
        ]
        if stored.incident:
            items.append({"Update": self._close(key, stored.incident, reason, now)})
        self.dynamodb.transact_write_items(TransactItems=items)
        return stored.incident is not None

    def _close(self, key: str, incident: str, reason: str, now: float) -> dict[str, Any]:
        return {
            "TableName": self.table,
            "Key": {"pk": {"S": key}, "sk": {"S": incident}},
            "UpdateExpression": "SET #st = :closed, closed_at = :t, close_reason = :r",
            "ExpressionAttributeNames": {"#st": "status"},
            "ExpressionAttributeValues": {":closed": {"S": "closed"}, ":t": {"N": f"{now:.3f}"}, ":r": {"S": reason}},
        }

    def stops(self, key: str) -> list[StopRecord]:
        """Stallwatch's stops of a job (the engine's, not an operator's), oldest first, from its audit trail."""
        found = (stop_of(r["record"], r.get("outcome")) for r in self.records(key, "audit"))
        return [s for s in found if s is not None]

    def records(self, key: str, kind: str) -> list[dict[str, Any]]:
        """A job's audit records or incidents (`kind` "audit" or "incident"), oldest first, as plain dicts."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :kind)",
            ExpressionAttributeValues={":pk": {"S": key}, ":kind": {"S": f"{kind}#"}},
        )
        return [_plain(item) for page in pages for item in page["Items"]]


def _stored(item: dict[str, Any]) -> StoredState:
    """A state item as read; one that holds only a claim (no decision committed yet) is the empty state."""
    if "state" not in item:
        return StoredState()
    return StoredState(
        state=_state_from_json(item["state"]["S"]),
        version=int(item["version"]["N"]),
        incident=item.get("incident", {}).get("S"),
        updated_at=float(item["updated_at"]["N"]) if "updated_at" in item else None,
        stop_post=json.loads(item["stop_post"]["S"]) if "stop_post" in item else None,
        unfinished=json.loads(item["unfinished"]["S"]) if "unfinished" in item else None,
    )


def _audit_item(key: str, sk: str, audit: dict[str, Any], expires: dict[str, str]) -> dict[str, Any]:
    record = json.dumps(record_budget.fit(audit, AUDIT_BYTES), default=str)
    return {"pk": {"S": key}, "sk": {"S": sk}, "record": {"S": record}, "expires_at": expires}


def _incident_item(key: str, sk: str, audit: dict[str, Any], now: float, expires: dict[str, str]) -> dict[str, Any]:
    reasons = record_budget.fit({"reasons": audit.get("reasons", [])}, AUDIT_BYTES).get("reasons", [])
    return {
        "expires_at": expires,
        "pk": {"S": key},
        "sk": {"S": sk},
        "status": {"S": "open"},
        "opened_at": {"N": f"{now:.3f}"},
        "diagnosis": {"S": str(audit.get("diagnosis", ""))},
        "reasons": {"S": json.dumps(reasons)},
    }


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    """A DynamoDB item as a dict; JSON string attributes (`record`, `outcome`, `state`) decoded."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        ((kind, raw),) = value.items()
        out[name] = float(raw) if kind == "N" else raw
        if name in ("record", "outcome", "state", "reasons"):
            out[name] = json.loads(raw)
    return out
