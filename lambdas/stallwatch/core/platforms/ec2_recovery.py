"""Recover in place, EC2's way back: the rules for restarting a stalled EC2 cluster's training on its own instances.

Pure. An EC2 job tagged `stallwatch:recover=restart` that the engine would stop for a hang or a crashed rank is
checked node by node (Stallwatch's health-check SSM document prints one JSON line a node), restarted in place on its
healthy nodes, and rid of a bad node: an Auto Scaling group replaces it, else it is stopped when the job allows fewer
nodes (`stallwatch:min-nodes`); otherwise the job is stopped as without recovery. The tag, the budget and the
no-progress rule are every way back's (`core.way_back`); the steps are the adapter's (`aws.platforms.ec2_restart`).

    report = parse_health(invocation_output)                                    # one node's HealthReport
    failures = health_failures(report, "p4d.24xlarge", efa_expected=True)      # ("Xid 79: GPU has fallen off ...",)
    step = after_checks(checks, groups={"i-1": "asg-a"}, min_nodes=None, deadline_passed=False)   # Restart, ...
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stallwatch.core.command_answers import Invocation, NodeCheck, NodeState, command_states
from stallwatch.core.pricing import INSTANCE_SPECS, accelerated, instance_spec, neuron
from stallwatch.core.signals import Series
from stallwatch.core.way_back import HARDWARE_XIDS, TagError

MIN_NODES_TAG = "stallwatch:min-nodes"  # the fewest nodes the job's launcher can train on (torchrun --nnodes=MIN:MAX)
TRAINING_UNIT = "stallwatch-train.service"  # deploy/ec2's systemd unit for the launcher; the restart document's
FAILED_CHECK = "failed its health check"  # what a bad node did, in the texts
MOVED_OFF = "is moved off before its scheduled event"  # ... and a node an AWS Health event names (`runtime.health`)
HEALTH_MARKER = "stallwatch_health"  # the key of the health check's JSON line (its value: the format's version)
# Bounds, in seconds. The health check's delivery timeout (SendCommand TimeoutSeconds, SSM's least is 30) and the
# control plane's wait for every node's answer, beyond the document's own execution timeout (600 s).
HEALTH_DELIVERY_TIMEOUT_S = 120
HEALTH_CHECK_WAIT_S = 900
RESTART_DELIVERY_TIMEOUT_S = 120
RESTART_WAIT_S = 600  # the restart command's answer (the document bounds `systemctl restart` to 300 s)
REPLACEMENT_WAIT_S = 1200  # an Auto Scaling group's replacement of a node marked unhealthy, until it runs
# Instance types whose multi-node training runs over EFA: the device must be present on each node.
EFA_TYPES = frozenset(
    {
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
        "trn1.32xlarge",
        "trn1n.32xlarge",
        "trn2.48xlarge",
    }
)
NVIDIA_SMI_STATES = {"timeout": "nvidia-smi -q timed out (a GPU that stopped answering)", "absent": "no nvidia-smi"}
NEURON_LS_STATES = {
    "timeout": "neuron-ls timed out (a Neuron device that stopped answering)",
    "absent": "no neuron-ls (aws-neuronx-tools)",
}
NEURON = "neuron"  # the document's `accelerator` on a node with Neuron devices (the driver's sysfs, or neuron-ls)
# The values the health-check document writes for its probes' states.
REPORT_STATES = {
    "nvidia_smi": frozenset({"ok", "timeout", "absent", "error"}),
    "efa": frozenset({"present", "missing", "no_tool", "timeout"}),
    "dcgm": frozenset({"pass", "fail", "timeout", "absent"}),
    "accelerator": frozenset({"nvidia", NEURON}),
    "neuron_ls": frozenset({"ok", "timeout", "absent", "error"}),
}


class HealthOutputError(ValueError):
    """A node's output holds no health report line (not Stallwatch's document, or cut short)."""


def min_nodes(tags: Mapping[str, str]) -> int | None:
    """The fewest nodes the job may restart on (`stallwatch:min-nodes`); None: all of them. `TagError` if bad."""
    raw = tags.get(MIN_NODES_TAG)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise TagError(f"{MIN_NODES_TAG}={raw!r}: expected a whole number of nodes, at least 1")
    return int(text)


def efa_expected(instance_type: str, nodes: int) -> bool:
    """Whether a node must have its EFA device: a multi-node job of a type that trains over EFA."""
    return nodes > 1 and instance_type in EFA_TYPES


# ---- one node's health ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthReport:
    """What the health-check document found on one node (its JSON line): a GPU node's nvidia-smi, NVLink and DCGM,
    or a Neuron node's neuron-ls and driver counters; both nodes' kernel log and EFA."""

    nvidia_smi: str  # ok, timeout, absent (or not run: a Neuron node), error
    gpus: int  # GPUs nvidia-smi -q lists (-1 when it did not answer)
    xids: tuple[int, ...] = ()  # Xid codes in the kernel log since boot
    ecc_uncorrectable: int = 0  # volatile uncorrectable ECC errors, all GPUs
    retired_pages_pending: int = 0  # GPUs with pages pending retirement
    remapped_rows_pending: int = 0  # GPUs with a row remapping pending (a GPU reset applies it)
    remapped_rows_failure: int = 0  # GPUs whose row remapping failed
    nvlink_inactive: int = 0  # NVLink links reported inactive
    efa: str = "present"  # present, missing, no_tool, timeout
    dcgm: str = "absent"  # pass, fail, timeout, absent (DCGM not installed)
    accelerator: str = "nvidia"  # nvidia, or neuron: the devices the node was checked for (an older document: nvidia)
    neuron_ls: str = "absent"  # ok, timeout, absent, error
    neuron_devices: int = -1  # Neuron devices neuron-ls lists (-1 when it did not answer)
    neuron_ecc_uncorrectable: int = 0  # the driver's uncorrectable ECC events (DRAM and SRAM), all devices


def parse_health(output: str) -> HealthReport:
    """The node's report: the last JSON line of `output` that carries `HEALTH_MARKER`."""
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and HEALTH_MARKER in data:
            return _report(data)
    raise HealthOutputError(f"no {HEALTH_MARKER} line in the node's output ({len(output)} characters)")


def _report(data: dict[str, Any]) -> HealthReport:
    """The report's fields, each of the type and values the document writes; a node's output is not trusted, so an
    error names the field, never the value (it reaches Slack)."""

    def count(name: str, default: int = 0) -> int:
        value = data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise HealthOutputError(f"{name}: expected a whole number")
        return value

    def state(name: str, default: str) -> str:
        value = data.get(name, default)
        if value not in REPORT_STATES[name]:
            raise HealthOutputError(f"{name}: expected one of {', '.join(sorted(REPORT_STATES[name]))}")
        return str(value)

    xids = data.get("xid", [])
    if not isinstance(xids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in xids):
        raise HealthOutputError("xid: expected a list of Xid codes")
    return HealthReport(
        nvidia_smi=state("nvidia_smi", "error"),
        gpus=count("gpus"),
        xids=tuple(xids),
        ecc_uncorrectable=count("ecc_uncorrectable"),
        retired_pages_pending=count("retired_pages_pending"),
        remapped_rows_pending=count("remapped_rows_pending"),
        remapped_rows_failure=count("remapped_rows_failure"),
        nvlink_inactive=count("nvlink_inactive"),
        efa=state("efa", "missing"),
        dcgm=state("dcgm", "absent"),
        accelerator=state("accelerator", "nvidia"),
        neuron_ls=state("neuron_ls", "absent"),
        neuron_devices=count("neuron_devices", -1),
        neuron_ecc_uncorrectable=count("neuron_ecc_uncorrectable"),
    )


def health_failures(report: HealthReport, instance_type: str, efa_expected: bool) -> tuple[str, ...]:
    """What the node failed, worded for Slack; empty for a healthy node. A node of a CPU-only type (a heterogeneous
    cluster's data loaders) has no GPU to check; a Neuron type's (trn, inf) devices are the Neuron tools' to check."""
    if not accelerated(instance_type):
        failures = []
    elif neuron(instance_type):
        failures = _neuron_failures(report, instance_type)
    else:
        failures = _gpu_failures(report, instance_type)
    if efa_expected and report.efa != "present":
        failures.append(f"EFA device {report.efa.replace('_', ' ')} (fi_info -p efa)")
    return tuple(failures)


def _neuron_failures(report: HealthReport, instance_type: str) -> list[str]:
    if report.accelerator != NEURON:
        return ["no Neuron device or tools (no Neuron driver sysfs, no neuron-ls)"]
    failures: list[str] = []
    if report.neuron_ls != "ok":
        failures.append(NEURON_LS_STATES.get(report.neuron_ls, f"neuron-ls failed ({report.neuron_ls})"))
    expected = _expected_devices(instance_type)
    if report.neuron_ls == "ok" and expected is not None and report.neuron_devices != expected:
        failures.append(f"{report.neuron_devices} of {expected} Neuron devices visible")
    n = report.neuron_ecc_uncorrectable
    if n > 0:
        failures.append(f"{n} uncorrectable Neuron ECC error{'s' if n > 1 else ''}")
    return failures


def _expected_devices(instance_type: str) -> int | None:
    return instance_spec(instance_type).devices if instance_type in INSTANCE_SPECS else None


def _gpu_failures(report: HealthReport, instance_type: str) -> list[str]:
    failures: list[str] = []
    if report.nvidia_smi != "ok":
        failures.append(NVIDIA_SMI_STATES.get(report.nvidia_smi, f"nvidia-smi -q failed ({report.nvidia_smi})"))
    expected = _expected_devices(instance_type)
    if report.nvidia_smi == "ok" and expected is not None and report.gpus != expected:
        failures.append(f"{report.gpus} of {expected} GPUs visible")
    failures += [f"Xid {code}: {HARDWARE_XIDS[code]}" for code in report.xids if code in HARDWARE_XIDS]
    counted = (
        (report.ecc_uncorrectable, "uncorrectable ECC error{s}"),
        (report.remapped_rows_failure, "row remapping failure{s}"),
        (report.remapped_rows_pending, "row remapping{s} pending (needs a GPU reset)"),
        (report.retired_pages_pending, "GPU{s} with pages pending retirement"),
        (report.nvlink_inactive, "NVLink link{s} down"),
    )
    failures += [f"{n} {what.format(s='s' if n > 1 else '')}" for n, what in counted if n > 0]
    if report.dcgm in ("fail", "timeout"):
        failures.append(f"dcgmi diag -r 1 {'failed' if report.dcgm == 'fail' else 'timed out'}")
    return failures


def check_nodes(
    invocations: Mapping[str, Invocation],
    nodes: tuple[str, ...],
    types: Mapping[str, str],
    deadline_passed: bool,
) -> dict[str, NodeCheck]:
    """Each node's health from its health-check invocation (`command_states`), and from the report of each that
    answered, what it failed (EFA on a multi-node job's nodes of EFA types). `types`: node -> instance type."""
    checks = command_states(invocations, nodes, deadline_passed)
    for node, check in checks.items():
        if check.state is not NodeState.SUCCEEDED:
            continue
        instance_type = types.get(node, "")
        try:
            report = parse_health(invocations[node].output)
            failures = health_failures(report, instance_type, efa_expected(instance_type, len(nodes)))
        except HealthOutputError as exc:
            failures = (f"unreadable health report: {exc}",)
        checks[node] = NodeCheck(node, check.state, failures)
    return checks


# ---- what follows the checks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    """Some nodes have not answered yet, and the wait is not over."""


@dataclass(frozen=True)
class Restart:
    """Every node passed: restart the training on `nodes`."""

    nodes: tuple[str, ...]


@dataclass(frozen=True)
class TakeOut:
    """Bad nodes out: those in an Auto Scaling group marked unhealthy (`replace`: node -> group), the others stopped
    (`stop`); the training restarts on `keep` (and the replacements, once they run)."""

    bad: dict[str, tuple[str, ...]]  # node -> what it failed
    stop: tuple[str, ...] = ()
    replace: dict[str, str] = field(default_factory=dict)
    keep: tuple[str, ...] = ()


@dataclass(frozen=True)
class FallBack:
    """Recovery in place is not possible: stop the job as without it, for `reason`."""

    reason: str


def after_checks(
    checks: Mapping[str, NodeCheck],
    groups: Mapping[str, str | None],
    floor: int | None,
    deadline_passed: bool,
    what: str = FAILED_CHECK,
) -> Wait | Restart | TakeOut | FallBack:
    """What to do with the nodes' answers. `groups`: node -> its Auto Scaling group (None outside one); `floor`: the
    job's `stallwatch:min-nodes` (None: it needs all of its nodes); `what`: what a bad node did, in the reason."""
    pending = [c for c in checks.values() if c.state in (NodeState.WAITING, NodeState.RUNNING)]
    if pending and not deadline_passed:
        return Wait()
    lost = [c for c in checks.values() if c.state is NodeState.UNDELIVERABLE]
    if lost:
        named = "; ".join(f"{c.node} ({c.detail})" for c in lost)
        return FallBack(f"the health check could not be delivered to {named}: is the SSM agent running?")
    bad = {c.node: c.failures for c in checks.values() if not c.healthy}
    if not bad:
        return Restart(tuple(checks))
    replace = {node: group for node in bad if (group := groups.get(node))}
    stop = tuple(node for node in bad if node not in replace)
    keep = tuple(node for node in checks if node not in bad)
    left = len(checks) - len(stop)
    if stop and (floor is None or left < floor or not keep):
        allowed = (
            f"the job does not allow fewer nodes (no {MIN_NODES_TAG} tag)"
            if floor is None
            else f"{left} node{'s' if left != 1 else ''} would be left, fewer than {MIN_NODES_TAG}={floor}"
        )
        return FallBack(f"{named_failures(bad, what)}; not in an Auto Scaling group, and {allowed}")
    return TakeOut(bad=bad, stop=stop, replace=replace, keep=keep)


def named_failures(bad: Mapping[str, tuple[str, ...]], what: str = FAILED_CHECK) -> str:
    """ "i-0abc failed its health check (Xid 79: GPU has fallen off the bus)", for each bad node."""
    return "; ".join(f"{node} {what} ({', '.join(why) or 'no reason given'})" for node, why in bad.items())


def restart_failures(checks: Mapping[str, NodeCheck]) -> str | None:
    """Why the restart command did not go through on every node (None when it did)."""
    failed = [c for c in checks.values() if c.state not in (NodeState.SUCCEEDED, NodeState.WAITING, NodeState.RUNNING)]
    if not failed:
        return None
    return "the restart failed on " + "; ".join(f"{c.node} ({', '.join(c.failures) or c.detail})" for c in failed)


# ---- after the restart ------------------------------------------------------------------------------------------


def first_progress(
    steps: Series, step: Series, log_last_t: float | None, restarted_at: float, period: float
) -> tuple[float, float | None] | None:
    """By when the restarted training first made progress, and the step (None without the agent): the end of the
    first period with steps that ends after the restart (the job made none while it stalled; the step came within
    it); without the agent's series, its first log line after the restart."""
    if len(steps):
        for t, count in steps.points:
            if count > 0 and t + period > restarted_at:
                reached = [v for s, v in step.points if s >= t]
                return t + period, reached[0] if reached else None
        return None
    if log_last_t is not None and log_last_t > restarted_at:
        return log_last_t, None
    return None


# ---- what Slack is told -----------------------------------------------------------------------------------------


def checking_text(job: str, diagnosis: str, nodes: int, attempt: int, allowed: int, reasons: tuple[str, ...]) -> str:
    why = "".join(f"\n- {reason}" for reason in reasons)
    return (
        f":stethoscope: `{job}` stalled ({diagnosis}): recovering in place instead of stopping (restart {attempt} "
        f"of {allowed}): checking the health of its {nodes} node{'s' if nodes != 1 else ''} through SSM{why}"
    )


def restarting_text(job: str, nodes: int, passed: int) -> str:
    checked = f"{passed} of {nodes} nodes passed the health check"
    return f":arrows_counterclockwise: `{job}`: {checked}; restarting the training in place (`{TRAINING_UNIT}`)"


def taken_out_text(job: str, step: TakeOut, wait_s: float, what: str = FAILED_CHECK) -> str:
    parts = [named_failures(step.bad, what)]
    if step.replace:
        groups = ", ".join(sorted(set(step.replace.values())))
        parts.append(
            f"marked unhealthy in Auto Scaling group `{groups}`; the restart follows once its replacement runs "
            f"(up to {wait_s / 60:.0f} min)"
        )
    if step.stop:
        parts.append(f"stopped {', '.join(step.stop)}")
    if not step.replace:
        others = f"{len(step.keep)} other{'s' if len(step.keep) != 1 else ''}"
        parts.append(f"restarting the training in place on the {others} (`{TRAINING_UNIT}`)")
    return f":hammer_and_wrench: `{job}`: " + "; ".join(parts)


def fell_back_text(job: str, reason: str, stop_detail: str) -> str:
    return f":octagonal_sign: `{job}`: cannot recover in place: {reason}; stopped the job instead ({stop_detail})"


def progress_text(job: str, step: float | None, seconds_after_restart: float) -> str:
    after = max(seconds_after_restart, 0.0)
    when = f"{after:.0f} s" if after < 120 else f"{after / 60:.0f} min"
    what = f"step {step:,.0f}" if step is not None else "its logs resumed"
    return f":white_check_mark: `{job}`: training again after the restart in place: {what} within {when} of the restart"
