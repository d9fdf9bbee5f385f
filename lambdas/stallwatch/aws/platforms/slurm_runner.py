"""The commands of each Slurm cluster's runner (deploy/slurm/stallwatch-runner), kept in the deployment's table, and
the runner's answers and heartbeat. The runner pulls its cluster's partition (outbound only: it needs no inbound
path, no SSM document, no instance tag), runs each command it takes, and answers on the command's item.

    pk = "slurm-command#<cluster>"   sk = "cmd#<sent at>#<id>"   a command (JSON), its answer once answered
    pk = "slurm-command#<cluster>"   sk = "report"               the sweep's question about its running jobs, answered
    pk = "slurm-runner"              sk = "<cluster>"            the runner's last poll (seen_at, host, version)

    runners = Runners(store)
    ref = runners.send(cancel("pc1", "42", "2026-12-01T10:00:00"), now)
    answer = runners.answer(ref)              # None until the runner answered
    runners.ask_report(report("pc1", jobs), now); view = runners.report("pc1")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stallwatch.aws.store import Store
from stallwatch.core.platforms.slurm_runner import Command

COMMAND_PK = "slurm-command#"
COMMAND_SK = "cmd#"
REPORT_SK = "report"
RUNNER_PK = "slurm-runner"
REF_SEPARATOR = "|"  # a command's reference: "<cluster>|<sk>" (a cluster name holds no '|')
COMMAND_TTL_S = 86_400  # an unanswered command is the runner's for a day at most, then it goes


@dataclass(frozen=True)
class Runner:
    """A cluster's runner as its last poll said: when, on which host, which version."""

    cluster: str
    seen_at: float
    host: str = ""
    version: str = ""


class Runners:
    """The runners' items of the table (`store`'s)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dynamodb = store.dynamodb
        self.table = store.table

    def send(self, command: Command, now: float) -> str:
        """Queue `command` for its cluster's runner; its reference, for `answer`."""
        sk = f"{COMMAND_SK}{now:017.3f}#{command.id}"
        self.dynamodb.put_item(
            TableName=self.table,
            Item={
                "pk": {"S": COMMAND_PK + command.cluster},
                "sk": {"S": sk},
                "command": {"S": json.dumps(command.as_json(), separators=(",", ":"))},
                "expires_at": {"N": str(int(now + COMMAND_TTL_S))},
            },
            ConditionExpression="attribute_not_exists(pk)",
        )
        return f"{command.cluster}{REF_SEPARATOR}{sk}"

    def answer(self, ref: str) -> dict[str, Any] | None:
        """The runner's answer to the command `ref` names; None while it has not answered (or the command is gone)."""
        cluster, _, sk = ref.partition(REF_SEPARATOR)
        item = self._get(cluster, sk)
        return json.loads(item["answer"]["S"]) if item is not None and "answer" in item else None

    def forget(self, ref: str) -> None:
        """The command's item removed once its answer is read (its TTL removes it otherwise)."""
        cluster, _, sk = ref.partition(REF_SEPARATOR)
        self.dynamodb.delete_item(TableName=self.table, Key=_key(cluster, sk))

    def ask_report(self, command: Command, now: float) -> None:
        """The cluster's report question, replacing the last one (answered or not): the runner answers the newest."""
        self.dynamodb.put_item(
            TableName=self.table,
            Item={
                "pk": {"S": COMMAND_PK + command.cluster},
                "sk": {"S": REPORT_SK},
                "command": {"S": json.dumps(command.as_json(), separators=(",", ":"))},
                "asked_at": {"N": f"{now:.3f}"},
                "expires_at": {"N": str(int(now + COMMAND_TTL_S))},
            },
        )

    def report(self, cluster: str) -> tuple[Command | None, dict[str, Any] | None]:
        """The cluster's last report question (its jobs) and the runner's answer to it (None while unanswered)."""
        item = self._get(cluster, REPORT_SK)
        if item is None:
            return None, None
        asked = json.loads(item["command"]["S"])
        command = Command(
            asked["kind"],
            asked["cluster"],
            id=asked["id"],
            jobs=tuple((str(job_id), str(submitted)) for job_id, submitted in asked.get("jobs") or ()),
        )
        return command, json.loads(item["answer"]["S"]) if "answer" in item else None

    def runners(self) -> list[Runner]:
        """Every cluster's runner that ever polled this deployment's table, by its last poll."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": RUNNER_PK}},
        )
        return [
            Runner(
                item["sk"]["S"],
                float(item["seen_at"]["N"]),
                item.get("host", {}).get("S", ""),
                item.get("version", {}).get("S", ""),
            )
            for page in pages
            for item in page["Items"]
        ]

    def _get(self, cluster: str, sk: str) -> dict[str, Any] | None:
        return self.dynamodb.get_item(TableName=self.table, Key=_key(cluster, sk), ConsistentRead=True).get("Item")


def _key(cluster: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": COMMAND_PK + cluster}, "sk": {"S": sk}}
