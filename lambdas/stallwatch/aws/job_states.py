"""Each job's state in the table, with its incidents: what a decision reads, claims and commits.

    pk = "job#sagemaker#my-job"  sk = "state"                  JobState (JSON), version, open incident,
                                                              unfinished decision, failed-stop message, claim
    pk = "job#sagemaker#my-job"  sk = "incident#<opened_at>"   status open/closed, diagnosis, reasons

A decision is committed in one transaction (state at the version it was read + audit record + event claim + the
incident it opens or closes), so a duplicated event or a concurrent decision on the same job loses the race and acts
on nothing.

    states = JobStates(store)
    read = states.claim_decision(key, now, hold_seconds)       # None: another invocation decides the job now
    audit_sk = states.commit(key, read, written, audit, now, event_key=..., acting=True)
    states.finish_decision(key, audit_sk, outcome, written, now)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from stallwatch.aws.audit_trail import AUDIT_BYTES, AuditTrail
from stallwatch.aws.event_claims import EventClaims
from stallwatch.aws.observability import logger
from stallwatch.aws.pending_posts import PendingPosts
from stallwatch.aws.store import Store
from stallwatch.core import record_budget
from stallwatch.core.decision import JobState

STATE_SK = "state"
CHANGE_ATTEMPTS = 3  # a concurrent decision on the same job may win a commit; read again and retry


class ConcurrentDecisionError(RuntimeError):
    """The job's state changed since it was read, or the event was already handled: nothing was written."""


class AlreadyHandledError(ConcurrentDecisionError):
    """The event (a Slack request, a CLI call) was claimed before: a replay, nothing was written."""


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
    data["deaths"] = tuple(data.get("deaths", ()))
    if data.get("warning") is not None:
        data["warning"] = tuple(data["warning"])
    return JobState(**data)


class JobStates:
    """The job-state and incident items of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dynamodb = store.dynamodb
        self.table = store.table
        self.audit = AuditTrail(store)
        self.events = EventClaims(store)
        self.posts = PendingPosts(store)

    def load(self, key: str) -> StoredState:
        item = self.dynamodb.get_item(
            TableName=self.table, Key={"pk": {"S": key}, "sk": {"S": STATE_SK}}, ConsistentRead=True
        ).get("Item")
        return _stored(item) if item else StoredState()

    def load_many(self, keys: list[str]) -> dict[str, StoredState]:
        """States of many jobs, 100 keys per BatchGetItem call; jobs never seen get an empty state."""
        found = self.store.batch_get(keys, STATE_SK)
        return {key: _stored(found[key]) if key in found else StoredState() for key in keys}

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
                ExpressionAttributeValues={
                    **values,
                    ":until": {"N": f"{until:.3f}"},
                    ":expires": self.store.expires(now),
                },
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
        expires = self.store.expires(now)
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
            self.audit.put(key, audit_sk, audit, now),
        ]
        if event_key:
            items.append(self.events.put(event_key, now))
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
                if self.events.handled(event_key):
                    raise AlreadyHandledError(f"request {event_key} was already handled") from None
        raise ConcurrentDecisionError(f"{key}: the state kept changing; gave up after {CHANGE_ATTEMPTS} attempts")

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
        items: list[dict[str, Any]] = [{"Update": self.audit.outcome_update(key, audit_sk, outcome)}]
        if unsent_message is not None:
            pending = self.posts.item(key, audit_sk, outcome, unsent_message, now)
            items.append({"Put": {"TableName": self.table, "Item": pending}})
        try:
            self.dynamodb.transact_write_items(TransactItems=[*items, {"Update": state_update}])
        except self.dynamodb.exceptions.TransactionCanceledException:
            logger.info("the job's state moved on since the decision: only its outcome is recorded", extra={"job": key})
            self.dynamodb.transact_write_items(TransactItems=items)

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
