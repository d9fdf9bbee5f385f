"""What the AWS Neuron tools say of a host (Trainium): its NeuronCore, and its cores' utilization, memory and power.

    core_name()                      # "NeuronCore-v2" on trn1, "NeuronCore-v3 LNC=2" on trn2: trainer_agent.peaks' key
    read_report(json.loads(line))    # one neuron-monitor report -> NeuronReport(utilization, memory_utilization)
    read_power()                     # the devices' mean power, % of their maximum (the driver's sysfs), or None

neuron-monitor (aws-neuronx-tools) streams one JSON report a period; its format is AWS's Neuron Monitor User Guide's
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/neuron-monitor-user-guide.html).
Power is not in it: the driver's sysfs has it, per device, as a percentage of the device's maximum, once a minute
(Neuron Sysfs User Guide, `stats/power/utilization`). Pure reading: trainer_agent.neuron_sampler runs the tools.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSFS_ROOT = Path("/sys/devices/virtual/neuron_device")
"""One directory per Neuron device (neuron0, neuron1, ...), when the Neuron driver is loaded."""
CORE_ARCH = Path("neuron0/neuron_core0/info/architecture/arch_type")  # "NCv2" (trn1), "NCv3" (trn2)
POWER_FILE = Path("stats/power/utilization")  # <status>,<epoch>,<min>,<max>,<avg>: percent of the device's maximum
POWER_VALID = "POWER_STATUS_VALID"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
"""Physical NeuronCores in one logical NeuronCore (trn2 and later: 2 by default; trn1: 1 only)."""
DEFAULT_LNC = "2"
FIRST_LOGICAL_VERSION = 3  # NeuronCore-v3 (Trainium2) is the first that groups physical cores into logical ones
ARCH = re.compile(r"NCv(\d+)")


@dataclass(frozen=True)
class NeuronReport:
    """One neuron-monitor report, per NeuronCore of the host: its mean utilization and device memory in use, in %;
    None where the report does not tell (memory: a neuron-monitor that does not give the devices' size)."""

    utilization: float | None
    memory_utilization: float | None


def present(root: Path | None = None) -> bool:
    """Whether the host has Neuron devices (the driver's sysfs)."""
    return (root or SYSFS_ROOT).is_dir()


def core_name(root: Path | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The NeuronCore one rank drives, as trainer_agent.peaks names it: "NeuronCore-v2" (trn1), "NeuronCore-v3 LNC=2"
    (trn2's default, a logical core of two physical ones), "NeuronCore-v3" with NEURON_LOGICAL_NC_CONFIG=1; None
    without a Neuron device."""
    try:
        arch = ((root or SYSFS_ROOT) / CORE_ARCH).read_text().strip()
    except OSError:
        return None
    match = ARCH.fullmatch(arch)
    if match is None:
        return arch
    version = int(match[1])
    logical = version >= FIRST_LOGICAL_VERSION and environ.get(LNC_ENV, DEFAULT_LNC).strip() == DEFAULT_LNC
    return f"NeuronCore-v{version}" + (f" LNC={DEFAULT_LNC}" if logical else "")


def read_report(report: Mapping[str, Any]) -> NeuronReport:
    """A neuron-monitor report, over the host's NeuronCores (every Neuron application's, `neuron_runtime_data`): each
    core's utilization (a core runs one application; one that none runs is idle), their mean over the host's cores
    (`neuron_hardware_info`: devices x cores per device, else the cores reported), and the device memory the
    applications hold over the devices' total. A malformed part reads as absent, never raises."""
    cores: dict[str, float] = {}
    device_bytes = 0.0
    for runtime in _items(report.get("neuron_runtime_data")):
        body = _mapping(runtime.get("report"))
        in_use = _mapping(_mapping(body.get("neuroncore_counters")).get("neuroncores_in_use"))
        for index, core in in_use.items():
            busy = _number(_mapping(core).get("neuroncore_utilization"))
            if busy is not None:
                cores[index] = min(cores.get(index, 0.0) + busy, 100.0)
        used = _mapping(_mapping(body.get("memory_used")).get("neuron_runtime_used_bytes"))
        device_bytes += _number(used.get("neuron_device")) or 0.0
    hardware = _mapping(report.get("neuron_hardware_info"))
    devices = _number(hardware.get("neuron_device_count"))
    per_device = _number(hardware.get("neuroncore_per_device_count"))
    device_size = _number(hardware.get("neuron_device_memory_size"))
    host_cores = devices * per_device if devices and per_device else len(cores)
    utilization = sum(cores.values()) / host_cores if host_cores else None
    memory = 100.0 * device_bytes / (devices * device_size) if devices and device_size else None
    return NeuronReport(utilization=utilization, memory_utilization=memory)


def read_power(root: Path | None = None) -> float | None:
    """The host's devices' mean power over the last minute, in % of each device's maximum (the driver's
    `stats/power/utilization`), over the devices whose sampling is valid; None without one."""
    readings = []
    for device in sorted((root or SYSFS_ROOT).glob("neuron[0-9]*")):
        try:
            fields = (device / POWER_FILE).read_text().strip().split(",")
        except OSError:
            continue
        if len(fields) == 5 and fields[0] == POWER_VALID and (average := _number(fields[4])) is not None:
            readings.append(average)
    return sum(readings) / len(readings) if readings else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
