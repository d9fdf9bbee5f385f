"""What deploy/slurm's events said of each Slurm job, kept in the table: a Slurm job has no describe API the
functions can call, so its facts are its events'.

    pk = "job#slurm#<cluster>-<id>-<name>"  sk = "attempt#<submit epoch>"   one attempt (SlurmJob JSON), its end
    pk = "slurm-running"                    sk = "<job name>"               the running attempt (the sweep's list)

The key holds the cluster and the submit time beside the id (Slurm reuses ids: a cluster made again counts from 1);
a requeue starts the next attempt under the same name with a new submit time and its restart count raised, which
links the attempts of one run (`runs`).

    jobs = SlurmJobs(store)
    jobs.start(job, now)                    # False: a late start of an attempt that has ended
    jobs.end(job, "CANCELLED", at, reason)  # the attempt the end event names (its submit time)
    jobs.current("pc1-42-llm")              # the newest attempt, or None
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, replace
from typing import Any

from stallwatch.aws.store import Store, job_key
from stallwatch.core.platforms.slurm import SlurmJob, SlurmNode
from stallwatch.core.signals import Platform

ATTEMPT_SK = "attempt#"
RUNNING_PK = "slurm-running"


class SlurmJobs:
    """The Slurm jobs' attempts in the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dynamodb = store.dynamodb
        self.table = store.table

    def start(self, job: SlurmJob, now: float) -> bool:
        """Keep the attempt as its start event says, and list it as running; False (nothing written) for an attempt
        that has ended already (a start event delivered late or twice)."""
        key = {"pk": {"S": job_key(Platform.SLURM, job.job_name)}, "sk": {"S": _attempt_sk(job.submit_epoch)}}
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item=key | {"job": {"S": _to_json(job)}, "expires_at": self.store.expires(now)},
                ConditionExpression="attribute_not_exists(ended)",
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            return False
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
        return True

    def end(self, job: SlurmJob, state: str, at: float, reason: str, now: float) -> SlurmJob:
        """The attempt `job` names (by its submit time) ended in `state`: kept as it started (or as the end event
        says, if its start was never heard), with its end; no longer listed as running."""
        name = job.job_name
        response = self.dynamodb.update_item(
            TableName=self.table,
            Key={"pk": {"S": job_key(Platform.SLURM, name)}, "sk": {"S": _attempt_sk(job.submit_epoch)}},
            UpdateExpression="SET job = if_not_exists(job, :job), ended = :at, end_state = :state, reason = :reason, "
            "expires_at = if_not_exists(expires_at, :expires)",
            ExpressionAttributeValues={
                ":job": {"S": _to_json(job)},
                ":at": {"N": f"{at:.3f}"},
                ":state": {"S": state},
                ":reason": {"S": reason},
                ":expires": self.store.expires(now),
            },
            ReturnValues="ALL_NEW",
        )
        with contextlib.suppress(self.dynamodb.exceptions.ConditionalCheckFailedException):  # a newer attempt runs
            self.dynamodb.delete_item(
                TableName=self.table,
                Key={"pk": {"S": RUNNING_PK}, "sk": {"S": name}},
                ConditionExpression="submit_epoch = :e",
                ExpressionAttributeValues={":e": {"N": str(job.submit_epoch)}},
            )
        return _attempt(response["Attributes"])

    def hold(self, name: str, submit_epoch: int, state: str, now: float) -> None:
        """The controller answered a stop of the attempt: it is in `state`, which is not a stall (SUSPENDED): kept
        with the attempt and its running entry, so the job is not stopped while it is believed."""
        current = self.current(name)
        if current is None or current.submit_epoch != submit_epoch or current.ended_epoch is not None:
            return
        held = current.held(state, now)
        values = {
            ":state": {"S": state},
            ":since": {"N": f"{held.held_since:.3f}"},
            ":checked": {"N": f"{now:.3f}"},
            ":e": {"N": str(submit_epoch)},
        }
        update = "SET held_state = :state, held_since = :since, held_checked = :checked"
        keys = [
            {"pk": {"S": job_key(Platform.SLURM, name)}, "sk": {"S": _attempt_sk(submit_epoch)}},
            {"pk": {"S": RUNNING_PK}, "sk": {"S": name}},
        ]
        for key in keys:
            with contextlib.suppress(self.dynamodb.exceptions.ConditionalCheckFailedException):  # ended, or newer
                self.dynamodb.update_item(
                    TableName=self.table,
                    Key=key,
                    UpdateExpression=update,
                    ConditionExpression="attribute_exists(pk) AND attribute_not_exists(ended) AND "
                    "(attribute_not_exists(submit_epoch) OR submit_epoch = :e)",
                    ExpressionAttributeValues=values,
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
        job = replace(
            job,
            held_state=item["held_state"]["S"],
            held_since=float(item["held_since"]["N"]),
            held_checked=float(item["held_checked"]["N"]),
        )
    if "ended" not in item:
        return job
    return job.ended(item["end_state"]["S"], float(item["ended"]["N"]), item.get("reason", {}).get("S", ""))


def _to_json(job: SlurmJob) -> str:
    return json.dumps(asdict(job), separators=(",", ":"))


def _from_json(text: str) -> SlurmJob:
    data = json.loads(text)
    return replace(SlurmJob(**{k: v for k, v in data.items() if k != "nodes"}), nodes=_nodes(data["nodes"]))


def _nodes(items: list[dict[str, Any]]) -> tuple[SlurmNode, ...]:
    return tuple(SlurmNode(**item) for item in items)
