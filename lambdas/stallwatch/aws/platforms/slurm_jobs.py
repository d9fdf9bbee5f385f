"""What deploy/slurm's events and the controller's reports said of each Slurm job, kept in the table: a Slurm job has
no describe API the functions can call, so its facts are its events', checked against its controller's view.

    pk = "job#slurm#<cluster>-<id>-<name>"  sk = "attempt#<submit epoch>"   one attempt (SlurmJob JSON), its end
    pk = "slurm-running"                    sk = "<job name>"               the running attempt (the sweep's list)

The key holds the cluster and the submit time beside the id (Slurm reuses ids: a cluster made again counts from 1);
a requeue starts the next attempt under the same name with a new submit time and its restart count raised, which
links the attempts of one run (`runs`).

    jobs = SlurmJobs(store)
    jobs.start(job, now)                    # STARTED; or ALREADY / ENDED: nothing written (a start never rewrites)
    jobs.end(job, "CANCELLED", at, reason)  # only the attempt the end names; None where it names none
    jobs.current("pc1-42-llm")              # the newest attempt, or None
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, replace
from enum import StrEnum
from typing import Any

from stallwatch.aws.store import Store, job_key
from stallwatch.core.platforms.hyperpod import HyperPodAction
from stallwatch.core.platforms.slurm import SlurmJob, SlurmNode
from stallwatch.core.signals import Platform

ATTEMPT_SK = "attempt#"
RUNNING_PK = "slurm-running"
HELD = ("held_state", "held_since", "held_checked", "held_until")
GONE = "GONE"  # an attempt that ended unheard and unseen: the controller no longer knows it


class Started(StrEnum):
    """What a start event did to the table."""

    STARTED = "started"  # the attempt is kept and listed as running
    ALREADY = "already"  # a start of an attempt already kept (repeated, or forged): nothing rewritten
    ENDED = "ended"  # a late start of an attempt that has ended: nothing written


class SlurmJobs:
    """The Slurm jobs' attempts in the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dynamodb = store.dynamodb
        self.table = store.table

    def start(self, job: SlurmJob, now: float) -> Started:
        """Keep the attempt as its start event says, and list it as running. An attempt kept already is never
        rewritten (a repeated start event cannot change its tags or nodes), nor one that has ended. An earlier
        attempt of the job still listed as running ended unheard: requeued where the restart count rose (its end
        event lost, or read after the requeue moved the submit time), else gone (Slurm reused the id)."""
        key = self._key(job.job_name, job.submit_epoch)
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item=key | {"job": {"S": _to_json(job)}, "expires_at": self.store.expires(now)},
                ConditionExpression="attribute_not_exists(pk)",
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            kept = self.dynamodb.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item") or {}
            return Started.ENDED if "ended" in kept else Started.ALREADY
        before = self.running().get(job.job_name)
        if before is not None and before.submit_epoch < job.submit_epoch:
            requeued = before.restarts < job.restarts
            said = "a later attempt started" if requeued else "the id began another job"
            self.retire(before, "REQUEUED" if requeued else GONE, float(job.submit_epoch), said)
        running = {"pk": {"S": RUNNING_PK}, "sk": {"S": job.job_name}}
        with contextlib.suppress(self.dynamodb.exceptions.ConditionalCheckFailedException):  # a newer attempt runs
            self.dynamodb.put_item(
                TableName=self.table,
                Item=running
                | {
                    "submit_epoch": {"N": str(job.submit_epoch)},
                    "job": {"S": _to_json(job)},
                    "expires_at": self.store.expires(now),
                },
                ConditionExpression="attribute_not_exists(pk) OR submit_epoch <= :e",
                ExpressionAttributeValues={":e": {"N": str(job.submit_epoch)}},
            )
        return Started.STARTED

    def end(self, job: SlurmJob, state: str, at: float, reason: str) -> SlurmJob | None:
        """The attempt `job` names (by its submit time) ended in `state`. None (nothing written) where it names no
        attempt that was heard to start, or one that has ended: an end never makes up an attempt, nor ends another."""
        kept = self._attempt(job.job_name, job.submit_epoch)
        if kept is None or kept.ended_epoch is not None:
            return None
        return self.retire(kept, state, at, reason)

    def retire(self, attempt: SlurmJob, state: str, at: float, reason: str) -> SlurmJob | None:
        """`attempt` (as kept) ended in `state` at `at`; no longer listed as running. None if it had ended already."""
        name = attempt.job_name
        try:
            response = self.dynamodb.update_item(
                TableName=self.table,
                Key=self._key(name, attempt.submit_epoch),
                UpdateExpression="SET ended = :at, end_state = :state, reason = :reason",
                ConditionExpression="attribute_exists(pk) AND attribute_not_exists(ended)",
                ExpressionAttributeValues={
                    ":at": {"N": f"{at:.3f}"},
                    ":state": {"S": state},
                    ":reason": {"S": reason},
                },
                ReturnValues="ALL_NEW",
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            return None
        with contextlib.suppress(self.dynamodb.exceptions.ConditionalCheckFailedException):  # a newer attempt runs
            self.dynamodb.delete_item(
                TableName=self.table,
                Key={"pk": {"S": RUNNING_PK}, "sk": {"S": name}},
                ConditionExpression="submit_epoch = :e",
                ExpressionAttributeValues={":e": {"N": str(attempt.submit_epoch)}},
            )
        return _attempt(response["Attributes"])

    def hold(self, name: str, submit_epoch: int, state: str, now: float) -> None:
        """The controller said the attempt is in `state`, which is not a stall (SUSPENDED): kept with the attempt and
        its running entry, so the job is not judged while it is so."""
        current = self._attempt(name, submit_epoch)
        if current is not None and current.ended_epoch is None:
            self._keep_held(current.held(state, now))

    def release(self, name: str, submit_epoch: int, now: float) -> None:
        """The controller said the attempt runs again after a hold: judged again from now."""
        current = self._attempt(name, submit_epoch)
        if current is not None and current.ended_epoch is None and current.held_until is None and current.held_state:
            self._keep_held(current.released(now))

    def record_hyperpod(self, name: str, submit_epoch: int, found: HyperPodAction) -> SlurmJob | None:
        """What HyperPod said it does about the attempt's node or the attempt, kept with it; the attempt as kept."""
        current = self._attempt(name, submit_epoch)
        if current is None or current.ended_epoch is not None:
            return None
        updated = current.with_hyperpod(found)
        if updated.hyperpod == current.hyperpod:
            return current
        value = {":h": {"S": json.dumps([a.as_json() for a in updated.hyperpod], separators=(",", ":"))}}
        self._update_both(name, submit_epoch, "SET hyperpod = :h", value)
        return updated

    def _keep_held(self, held: SlurmJob) -> None:
        values = {
            ":state": {"S": held.held_state},
            ":since": {"N": f"{held.held_since:.3f}"},
            ":checked": {"N": f"{held.held_checked:.3f}"},
            ":until": {"N": f"{held.held_until:.3f}"} if held.held_until is not None else {"NULL": True},
        }
        update = "SET held_state = :state, held_since = :since, held_checked = :checked, held_until = :until"
        self._update_both(held.job_name, held.submit_epoch, update, values)

    def _update_both(self, name: str, submit_epoch: int, update: str, values: dict[str, Any]) -> None:
        """`update` on the attempt and on its running entry (while it is this attempt's), neither once it ended."""
        keys = [self._key(name, submit_epoch), {"pk": {"S": RUNNING_PK}, "sk": {"S": name}}]
        for key in keys:
            with contextlib.suppress(self.dynamodb.exceptions.ConditionalCheckFailedException):  # ended, or newer
                self.dynamodb.update_item(
                    TableName=self.table,
                    Key=key,
                    UpdateExpression=update,
                    ConditionExpression="attribute_exists(pk) AND attribute_not_exists(ended) AND "
                    "(attribute_not_exists(submit_epoch) OR submit_epoch = :e)",
                    ExpressionAttributeValues=values | {":e": {"N": str(submit_epoch)}},
                )

    def current(self, name: str) -> SlurmJob | None:
        """The job's newest attempt (the one running, or the last that ran)."""
        items = self._attempts(name, newest_first=True, limit=1)
        return _attempt(items[0]) if items else None

    def attempts(self, name: str) -> list[SlurmJob]:
        """Every attempt kept under the job's name, oldest first."""
        return [_attempt(item) for item in self._attempts(name, newest_first=False)]

    def running(self) -> dict[str, SlurmJob]:
        """The running attempts, by job name (one Query of the running list)."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": RUNNING_PK}},
            ConsistentRead=True,
        )
        return {item["sk"]["S"]: _attempt(item) for page in pages for item in page["Items"]}

    def _attempt(self, name: str, submit_epoch: int) -> SlurmJob | None:
        item = self.dynamodb.get_item(TableName=self.table, Key=self._key(name, submit_epoch), ConsistentRead=True).get(
            "Item"
        )
        return _attempt(item) if item else None

    def _key(self, name: str, submit_epoch: int) -> dict[str, Any]:
        return {"pk": {"S": job_key(Platform.SLURM, name)}, "sk": {"S": _attempt_sk(submit_epoch)}}

    def _attempts(self, name: str, newest_first: bool, limit: int | None = None) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :attempt)",
            "ExpressionAttributeValues": {
                ":pk": {"S": job_key(Platform.SLURM, name)},
                ":attempt": {"S": ATTEMPT_SK},
            },
            "ScanIndexForward": not newest_first,
            "ConsistentRead": True,
        }
        if limit is not None:
            return list(self.dynamodb.query(**request, Limit=limit)["Items"])
        pages = self.dynamodb.get_paginator("query").paginate(**request)
        return [item for page in pages for item in page["Items"]]


def runs(attempts: list[SlurmJob]) -> list[list[SlurmJob]]:
    """The attempts (oldest first) as runs: a requeue's attempt (restart count raised, same cluster and id) goes on
    its run; any other (a reused id) begins one."""
    found: list[list[SlurmJob]] = []
    for attempt in attempts:
        last = found[-1][-1] if found else None
        linked = (
            last is not None
            and (attempt.cluster, attempt.job_id) == (last.cluster, last.job_id)
            and attempt.restarts > last.restarts
        )
        if linked:
            found[-1].append(attempt)
        else:
            found.append([attempt])
    return found


def _attempt_sk(submit_epoch: int) -> str:
    return f"{ATTEMPT_SK}{submit_epoch:012d}"


def _attempt(item: dict[str, Any]) -> SlurmJob:
    job = _from_json(item["job"]["S"])
    if "held_state" in item:
        job = replace(job, **{name: _number_or_text(item.get(name)) for name in HELD})
    if "hyperpod" in item:
        job = replace(job, hyperpod=tuple(HyperPodAction.of_json(a) for a in json.loads(item["hyperpod"]["S"])))
    if "ended" not in item:
        return job
    return job.ended(item["end_state"]["S"], float(item["ended"]["N"]), item.get("reason", {}).get("S", ""))


def _number_or_text(value: dict[str, Any] | None) -> Any:
    if value is None or "NULL" in value:
        return None
    return float(value["N"]) if "N" in value else value["S"]


def _to_json(job: SlurmJob) -> str:
    data = asdict(job)
    for name in (*HELD, "hyperpod"):  # kept as attributes of their own, so an update never rewrites the attempt
        data.pop(name)
    return json.dumps(data, separators=(",", ":"))


def _from_json(text: str) -> SlurmJob:
    data = json.loads(text)
    return replace(SlurmJob(**{k: v for k, v in data.items() if k != "nodes"}), nodes=_nodes(data["nodes"]))


def _nodes(items: list[dict[str, Any]]) -> tuple[SlurmNode, ...]:
    return tuple(SlurmNode(**item) for item in items)
