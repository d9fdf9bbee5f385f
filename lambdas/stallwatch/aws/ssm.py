"""SSM Run Command for recovery in place: send one of Stallwatch's documents to a job's nodes, read what each answered.

SendCommand is asynchronous: a call returns the command's id, and each node's invocation is read later
(ListCommandInvocations), by the next sweep. A send that SSM refuses (an instance not managed, its agent never
registered: InvalidInstanceId) is returned, never raised, so the caller can fall back to stopping the job.

    sent = send(clients, document, ("i-0abc...", "i-0def..."), comment, timeout_s=120)
    sent.command_ids, sent.error            # ("3f1c...",), ""    or (), "InvalidInstanceId: ..."
    answers = invocations(clients, sent.command_ids)        # node -> core.command_answers.Invocation
    command = find_command(clients, document, comment, since=t)   # one sent before its answer was lost
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.api_errors import api_error
from stallwatch.core import names
from stallwatch.core.command_answers import Invocation

INSTANCES_PER_COMMAND = 50  # SendCommand InstanceIds
INVOCATIONS_PER_PAGE = 50  # ListCommandInvocations MaxResults
COMMENT_LIMIT = 100  # SendCommand Comment; a longer one is cut with a hash (`core.names`): a command is found by it
# The document version sent: the stack gives a changed document a new version under the same name (UpdateMethod
# NewVersion, stacks/documents.py), so $LATEST is the deployed content and a command sent before is found by name.
LATEST = "$LATEST"


@dataclass(frozen=True)
class Documents:
    """The deployment's SSM documents, by name ("" where it has none: the action they take is not available); the
    stack names them in the functions' environment (`runtime.environment`), and each adapter is built with them."""

    health_check: str = ""  # recovery in place: a node's health check
    restart: str = ""  # recovery in place: restart the training unit


# Every node runs the command at once, and one node's failure never stops it reaching the others.
ALL_AT_ONCE = "100%"


@dataclass(frozen=True)
class Sent:
    """The commands sent (one per 50 nodes), and why the rest could not be (empty when all were)."""

    command_ids: tuple[str, ...]
    error: str = ""


def send(
    clients: Any,
    document: str,
    nodes: tuple[str, ...],
    comment: str,
    timeout_s: int,
    parameters: dict[str, str] | None = None,
) -> Sent:
    """SendCommand of `document` ($LATEST) to `nodes`, 50 a call; `timeout_s` is the delivery timeout (30 s or more);
    `parameters`: the document's, by name (each must match the document's allowedPattern, or SSM refuses it)."""
    sent: list[str] = []
    for offset in range(0, len(nodes), INSTANCES_PER_COMMAND):
        chunk = list(nodes[offset : offset + INSTANCES_PER_COMMAND])
        try:
            command = clients.ssm.send_command(
                DocumentName=document,
                DocumentVersion=LATEST,
                InstanceIds=chunk,
                TimeoutSeconds=timeout_s,
                Comment=names.within(comment, COMMENT_LIMIT),
                MaxConcurrency=ALL_AT_ONCE,
                MaxErrors=ALL_AT_ONCE,
                **({"Parameters": {k: [v] for k, v in parameters.items()}} if parameters else {}),
            )["Command"]
        except (ClientError, BotoCoreError) as exc:
            return Sent(tuple(sent), f"SendCommand {document} to {chunk}: {api_error(exc)}")
        sent.append(command["CommandId"])
    return Sent(tuple(sent))


def invocations(clients: Any, command_ids: tuple[str, ...]) -> dict[str, Invocation]:
    """Each node's invocation of the commands, with its plugin's output (the first 2,500 characters: the documents
    print one short JSON line)."""
    found: dict[str, Invocation] = {}
    paginator = clients.ssm.get_paginator("list_command_invocations")
    for command_id in command_ids:
        pages = paginator.paginate(
            CommandId=command_id, Details=True, PaginationConfig={"PageSize": INVOCATIONS_PER_PAGE}
        )
        for page in pages:
            for item in page["CommandInvocations"]:
                plugins = item.get("CommandPlugins") or [{}]
                found[item["InstanceId"]] = Invocation(
                    node=item["InstanceId"],
                    status=item["Status"],
                    details=item.get("StatusDetails", ""),
                    output=plugins[-1].get("Output", ""),
                    code=plugins[-1].get("ResponseCode"),
                )
    return found


def find_command(clients: Any, document: str, comment: str, since: float) -> str | None:
    """The id of a command of `document` with `comment` sent at or after `since` (a send whose Lambda died before
    it recorded the id), or None."""
    after = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pages = clients.ssm.get_paginator("list_commands").paginate(
        Filters=[{"key": "DocumentName", "value": document}, {"key": "InvokedAfter", "value": after}]
    )
    wanted = names.within(comment, COMMENT_LIMIT)
    for page in pages:
        for command in page["Commands"]:
            if command.get("DocumentName") == document and command.get("Comment") == wanted:
                return str(command["CommandId"])
    return None
