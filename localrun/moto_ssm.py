"""A small moto extension: SSM Run Command runs the document on simulated managed nodes, as their agents would.

moto 5.2.5's SendCommand records the command and answers every invocation Success with no output, for any
instance id (and, without Targets, for every instance of the account), and has no ListCommandInvocations. After
`install()`:

- SendCommand refuses a document that does not exist (InvalidDocument) and an instance no node is registered for
  (InvalidInstanceId: what SSM answers for an instance that is not managed, or whose agent never registered);
- each node's invocation runs the document's ``aws:runShellScript`` step as the agent does: the script written to a
  file and executed with the node's environment (`localrun.gpu_node`: its simulated tools first on PATH), bounded by
  the step's ``timeoutSeconds``; it ends Success or Failed with the exit code, the output and error (24,000 and
  8,000 characters; the plugin's Output, 2,500), or TimedOut (Execution Timed Out);
- a node whose agent is `Agent.UNRESPONSIVE` stays InProgress, one `Agent.OFFLINE` is Failed (Undeliverable);
- ListCommandInvocations filters by CommandId and InstanceId, pages (MaxResults, NextToken) and gives the plugins'
  details with ``Details``;
- DescribeInstanceInformation lists the registered nodes (filter InstanceIds), Online while their agent answers.

Commands run when they are sent, one after the other, so a test reads a settled result; with
`run_in_background(True)` (the demo, whose moto server serves one request at a time) each invocation is InProgress
while its script runs on a thread of its own, as on AWS. Callers read the result later either way, as they must.

    from localrun import moto_ssm
    moto_ssm.install()
    moto_ssm.manage("i-0abc...", GpuNode(tmp / "i-0abc", NodeFault.XID))
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml
from moto.core.responses import ActionResult
from moto.ssm.exceptions import SSMException
from moto.ssm.models import Command, SimpleSystemManagerBackend
from moto.ssm.responses import SimpleSystemManagerResponse

from localrun.gpu_node import Agent

STDOUT_LIMIT = 24_000  # GetCommandInvocation's StandardOutputContent
STDERR_LIMIT = 8_000
PLUGIN_OUTPUT_LIMIT = 2_500  # ListCommandInvocations' CommandPlugins[].Output
PLUGIN_ERROR_MARK = "\n----------ERROR-------\n"  # how the agent joins a plugin's output and error
DEFAULT_PAGE = 50
SHELL_STEP = "aws:runShellScript"
DEFAULT_STEP_TIMEOUT_S = 3600
PARAMETER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class ManagedNode(Protocol):
    """What the extension needs of a node: its agent's state and the environment its commands run with."""

    agent: Agent

    def environment(self) -> dict[str, str]: ...


_nodes: dict[str, ManagedNode] = {}
_lock = threading.Lock()
_default: Callable[[str], ManagedNode | None] | None = None
_plugins: dict[tuple[str, str], dict[str, Any]] = {}  # (command id, instance id) -> the plugin's details
_original_send: Any = None
_background = False


def run_in_background(enabled: bool) -> None:
    """Run each invocation on a thread of its own (InProgress until its script ends), or at once (the default)."""
    global _background
    _background = enabled


def manage(instance_id: str, node: ManagedNode) -> None:
    """Register `node` as the managed node of `instance_id` (its agent registered with SSM)."""
    with _lock:
        _nodes[instance_id] = node


def manage_new(factory: Callable[[str], ManagedNode | None] | None) -> None:
    """Nodes for instances not registered: `factory(instance_id)` (a replacement an Auto Scaling group launched
    boots with the agent), or None for an unmanaged one."""
    global _default
    _default = factory


def reset() -> None:
    """Forget every node (between tests)."""
    global _default
    with _lock:
        _nodes.clear()
        _plugins.clear()
    _default = None


def node_of(instance_id: str) -> ManagedNode | None:
    with _lock:
        node = _nodes.get(instance_id)
    if node is None and _default is not None:
        node = _default(instance_id)
        if node is not None:
            manage(instance_id, node)
    return node


def _send_command(self: SimpleSystemManagerBackend, **request: Any) -> Command:
    name = request["document_name"]
    document = self._get_documents(name).get_latest_version()  # InvalidDocument if it does not exist
    instance_ids = list(request["instance_ids"] or [])
    unmanaged = [i for i in instance_ids if node_of(i) is None]
    if unmanaged:
        raise SSMException(
            "InvalidInstanceId", f"Instances {unmanaged} not in a valid state for account {self.account_id}"
        )
    command = _original_send(self, **request | {"instance_ids": list(instance_ids)})
    # moto reads empty Targets as every instance of the account: the command goes to the instances asked for only
    command.instance_ids = instance_ids
    command.invocations = [i for i in command.invocations if i["InstanceId"] in instance_ids]
    command.target_count = command.completed_count = len(instance_ids)
    step = _shell_step(document.content, document.document_format)
    values = {**step["defaults"], **{k: v[0] if isinstance(v, list) else v for k, v in request["parameters"].items()}}
    script = PARAMETER.sub(lambda m: str(values.get(m.group(1), m.group(0))), step["script"])
    for invocation in command.invocations:
        node = node_of(invocation["InstanceId"])
        assert node is not None
        work = (command, invocation, node, step["name"], script, step["timeout"])
        if _background:
            _finish(command, invocation, step["name"], "InProgress", "InProgress", -1, "", "")
            threading.Thread(target=_run, args=work, name="ssm-agent", daemon=True).start()
        else:
            _run(*work)
    return command


def _settle(command: Command) -> None:
    """The command's status from its invocations'."""
    statuses = {i["Status"] for i in command.invocations}
    command.status = "InProgress" if "InProgress" in statuses else "Success" if statuses == {"Success"} else "Failed"
    command.status_details = command.status
    command.error_count = sum(1 for i in command.invocations if i["Status"] not in ("Success", "InProgress"))


def _shell_step(content: str, document_format: str) -> dict[str, Any]:
    """The document's one shell step: its name, script, timeout and the parameters' defaults."""
    document = yaml.safe_load(content) if document_format == "YAML" else json.loads(content)
    [step] = [s for s in document["mainSteps"] if s["action"] == SHELL_STEP]
    commands = step["inputs"]["runCommand"]
    return {
        "name": step["name"],
        "script": "\n".join(commands) if isinstance(commands, list) else commands,
        "timeout": int(step["inputs"].get("timeoutSeconds", DEFAULT_STEP_TIMEOUT_S)),
        "defaults": {k: str(v.get("default", "")) for k, v in (document.get("parameters") or {}).items()},
    }


def _run(command: Command, invocation: dict[str, Any], node: ManagedNode, step: str, script: str, timeout: int) -> None:
    """One node's invocation, as its agent runs it."""
    invocation["PluginName"] = step
    if node.agent is Agent.UNRESPONSIVE:
        _finish(command, invocation, step, "InProgress", "InProgress", -1, "", "")
        return
    if node.agent is Agent.OFFLINE:
        _finish(command, invocation, step, "Failed", "Undeliverable", -1, "", "")
        return
    # The script file is read by its interpreter, not executed: two nodes' threads forking while one writes its file
    # would make exec fail with "Text file busy".
    argv = _interpreter(script)
    with tempfile.TemporaryDirectory(prefix="ssm-") as workdir:
        path = Path(workdir) / "_script.sh"
        path.write_text(script)
        try:
            done = subprocess.run(
                [*argv, str(path)], env=node.environment(), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            _finish(command, invocation, step, "TimedOut", "Execution Timed Out", -1, out, "")
            return
        except OSError as exc:  # the agent could not start the script: the invocation fails, never hangs
            _finish(command, invocation, step, "Failed", "Failed", -1, "", f"{type(exc).__name__}: {exc}")
            return
    status = "Success" if done.returncode == 0 else "Failed"
    _finish(command, invocation, step, status, status, done.returncode, done.stdout, done.stderr)


def _interpreter(script: str) -> list[str]:
    """The script's interpreter and its arguments, from its ``#!`` line (else ``/bin/sh``, as the agent's default)."""
    first = script.lstrip().splitlines()[0] if script.strip() else ""
    return first[2:].split() if first.startswith("#!") else ["/bin/sh"]


def _finish(
    command: Command, invocation: dict[str, Any], step: str, status: str, details: str, code: int, out: str, err: str
) -> None:
    """The invocation's answer: its plugin's details first, then (one update) its status, which readers go by."""
    output = out + (PLUGIN_ERROR_MARK + err if err else "")
    plugin_status = "Failed" if details == "Undeliverable" else status
    _plugins[command.command_id, invocation["InstanceId"]] = {
        "Name": step,
        "Status": plugin_status,
        "StatusDetails": details,
        "ResponseCode": code,
        "Output": output[:PLUGIN_OUTPUT_LIMIT],
        "StandardOutputUrl": "",
        "StandardErrorUrl": "",
        "OutputS3Region": "us-east-1",
        "OutputS3BucketName": "",
        "OutputS3KeyPrefix": "",
    }
    invocation.update(
        Status=status,
        StatusDetails=details,
        ResponseCode=code,
        StandardOutputContent=out[:STDOUT_LIMIT],
        StandardErrorContent=err[:STDERR_LIMIT],
    )
    _settle(command)


def _list_command_invocations(self: SimpleSystemManagerResponse) -> ActionResult:
    command_id = self._get_param("CommandId")
    instance_id = self._get_param("InstanceId")
    details = bool(self._get_param("Details"))
    commands = self.ssm_backend.list_commands(command_id, None)
    found = [
        (command, invocation)
        for command in commands
        for invocation in command.invocations
        if instance_id is None or invocation["InstanceId"] == instance_id
    ]
    start = int(self._get_param("NextToken") or 0)
    size = int(self._get_param("MaxResults") or DEFAULT_PAGE)
    page = found[start : start + size]
    result: dict[str, Any] = {"CommandInvocations": [_invocation(c, i, details) for c, i in page]}
    if start + size < len(found):
        result["NextToken"] = str(start + size)
    return ActionResult(result)


def _invocation(command: Command, invocation: dict[str, Any], details: bool) -> dict[str, Any]:
    answer = {
        "CommandId": command.command_id,
        "InstanceId": invocation["InstanceId"],
        "Comment": command.comment,
        "DocumentName": command.document_name,
        "DocumentVersion": "$LATEST",
        "RequestedDateTime": command.requested_date_time,
        "Status": invocation["Status"],
        "StatusDetails": invocation["StatusDetails"],
        "StandardOutputUrl": "",
        "StandardErrorUrl": "",
    }
    plugin = _plugins.get((command.command_id, invocation["InstanceId"]))
    if details and plugin is not None:
        answer["CommandPlugins"] = [plugin]
    return answer


def _describe_instance_information(self: SimpleSystemManagerResponse) -> ActionResult:
    """The registered nodes (`manage`), filtered by InstanceIds: Online while their agent answers (moto 5.2.5 has no
    DescribeInstanceInformation)."""
    wanted: set[str] | None = None
    for found in self._get_param("Filters") or []:
        if found.get("Key") == "InstanceIds":
            wanted = set(found.get("Values", []))
    with _lock:
        nodes = dict(_nodes)
    listed = [
        {
            "InstanceId": instance,
            "PingStatus": "Online" if node.agent is Agent.ONLINE else "ConnectionLost",
            "PlatformType": "Linux",
            "ResourceType": "EC2Instance",
        }
        for instance, node in sorted(nodes.items())
        if wanted is None or instance in wanted
    ]
    return ActionResult({"InstanceInformationList": listed})


def install() -> None:
    """Patch moto (idempotent)."""
    global _original_send
    if _original_send is None:
        _original_send = SimpleSystemManagerBackend.send_command
        SimpleSystemManagerBackend.send_command = _send_command  # type: ignore[method-assign]
        SimpleSystemManagerResponse.list_command_invocations = _list_command_invocations  # type: ignore[attr-defined]
        SimpleSystemManagerResponse.describe_instance_information = _describe_instance_information  # type: ignore[attr-defined]
