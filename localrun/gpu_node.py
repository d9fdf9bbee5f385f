"""A simulated training node for Stallwatch's SSM documents: the tools they call, as small scripts.

The health-check and restart documents (deploy/ssm/) run `nvidia-smi` (or, on a Trainium node, `neuron-ls`),
`journalctl`/`dmesg`, `fi_info`, `dcgmi` and `systemctl`. A node here is a directory whose `bin/` holds scripts of
those names, answering in the formats the real tools print (nvidia-smi -q of a recent or an older driver, neuron-ls's
table, the kernel's NVRM Xid lines, libfabric's provider list), as a node in a given state would; the moto SSM
extension runs the documents with that `bin/` first on PATH, so the documents' own commands and parsing are what runs.

    node = GpuNode(tmp / "i-0abc", fault=NodeFault.XID)   # 8 x A100; the kernel logged Xid 79 for one GPU
    GpuNode(tmp / "i-0def", state=NodeState.trn1())      # a trn1.32xlarge: 16 Trainium devices, no nvidia-smi
    node.environment()                                   # {"PATH": ".../i-0abc/bin:/usr/bin:/bin", ...}
    node.restarts                                        # `systemctl restart stallwatch-train.service` calls
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from stallwatch.core.platforms.ec2_recovery import TRAINING_UNIT

GPUS_P4D = 8
TRN1_DEVICES = 16  # trn1.32xlarge: 16 Trainium chips
NVLINKS_PER_GPU = 12  # A100 SXM4
BUS_IDS = ("10:1C", "10:1D", "20:1C", "20:1D", "90:1C", "90:1D", "A0:1C", "A0:1D")
RESTART_REQUEST = "restart-requested"  # written by systemctl restart: the demo restarts the host's training
SYSTEMCTL_LOG = "systemctl.log"
TIMEOUT_EXIT = 124  # what `timeout` exits with when it kills the command it bounds


class Agent(StrEnum):
    """The node's SSM agent, as the moto SSM extension plays it."""

    ONLINE = "online"  # runs what it is sent
    UNRESPONSIVE = "unresponsive"  # took the command and never finishes it (a hung node)
    OFFLINE = "offline"  # registered, but nothing reaches it: the invocation is Undeliverable


class NodeFault(StrEnum):
    """What is wrong with the node, as its tools would show it."""

    NONE = "none"
    XID = "xid"  # the kernel logged Xid 79 (GPU has fallen off the bus)
    ECC = "ecc"  # two volatile uncorrectable DRAM ECC errors on one GPU
    REMAP_FAILURE = "remap_failure"  # row remapping failed on one GPU
    NVLINK = "nvlink"  # two NVLink links inactive
    NO_EFA = "no_efa"  # libfabric finds no EFA provider
    GPU_MISSING = "gpu_missing"  # 7 of 8 GPUs listed
    SMI_TIMEOUT = "smi_timeout"  # nvidia-smi hangs (answered as `timeout` ends it)
    DCGM_FAIL = "dcgm_fail"  # DCGM installed, and its quick diagnostic fails


@dataclass(frozen=True)
class NodeState:
    """The node's GPUs, kernel log, fabric and DCGM, as its tools report them."""

    gpus: int = GPUS_P4D
    xid_lines: tuple[str, ...] = ()
    ecc_uncorrectable: int = 0  # on the first GPU
    remap_failure: bool = False
    remap_pending: bool = False
    nvlink_inactive: int = 0
    efa: bool = True
    dcgm: str | None = None  # None: not installed; "pass" or "fail"
    smi_timeout: bool = False
    legacy_driver: bool = False  # an older driver's nvidia-smi -q (ECC as Single/Double Bit totals)
    restart_fails: bool = False  # the unit does not come back (systemctl is-active: failed)
    neuron_devices: int | None = None  # a Neuron node's devices, as neuron-ls lists them (it has no nvidia-smi)

    @classmethod
    def trn1(cls, devices: int = TRN1_DEVICES) -> NodeState:
        """A trn1.32xlarge with `devices` of its Trainium devices listed: the Neuron tools, no NVIDIA ones."""
        return cls(gpus=0, neuron_devices=devices)

    @classmethod
    def with_fault(cls, fault: NodeFault) -> NodeState:
        return {
            NodeFault.NONE: cls(),
            NodeFault.XID: cls(xid_lines=(xid_line(79, BUS_IDS[3], "GPU has fallen off the bus."),)),
            NodeFault.ECC: cls(ecc_uncorrectable=2),
            NodeFault.REMAP_FAILURE: cls(remap_failure=True),
            NodeFault.NVLINK: cls(nvlink_inactive=2),
            NodeFault.NO_EFA: cls(efa=False),
            NodeFault.GPU_MISSING: cls(gpus=GPUS_P4D - 1),
            NodeFault.SMI_TIMEOUT: cls(smi_timeout=True),
            NodeFault.DCGM_FAIL: cls(dcgm="fail"),
        }[fault]


def xid_line(code: int, bus: str, text: str, pid: int = 20412) -> str:
    """A kernel log line as the NVIDIA driver writes it: ``NVRM: Xid (PCI:0000:10:1d): 79, pid=..., ...``."""
    return f"NVRM: Xid (PCI:0000:{bus.lower()}): {code}, pid={pid}, name=python, {text}"


class GpuNode:
    """A node directory: `bin/` (the tools), and what the restart document did to it."""

    def __init__(self, root: Path, fault: NodeFault = NodeFault.NONE, state: NodeState | None = None) -> None:
        self.root = root
        self.state = state or NodeState.with_fault(fault)
        self.agent = Agent.ONLINE
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self._write_tools()

    def environment(self) -> dict[str, str]:
        """What a document runs with on this node: its tools first on PATH."""
        return {"PATH": f"{self.bin}:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(self.root)}

    @property
    def restarts(self) -> int:
        log = self.root / SYSTEMCTL_LOG
        return log.read_text().count(f"restart {TRAINING_UNIT}") if log.exists() else 0

    def take_restart_request(self) -> bool:
        """True once for each restart the document asked for since the last call (the demo restarts training)."""
        request = self.root / RESTART_REQUEST
        if not request.exists():
            return False
        request.unlink()
        return True

    def _write_tools(self) -> None:
        s = self.state
        data = self.root / "data"
        data.mkdir(exist_ok=True)
        (data / "kernel.log").write_text("\n".join([*BOOT_LINES, *s.xid_lines]) + "\n")
        if s.neuron_devices is not None:
            (data / "neuron-ls.txt").write_text(neuron_ls(s.neuron_devices))
            self._tool("neuron-ls", f"cat {q(data / 'neuron-ls.txt')}")
        else:
            self._nvidia_smi(data)
        self._tool("journalctl", f"cat {q(data / 'kernel.log')}")
        self._tool("dmesg", f"cat {q(data / 'kernel.log')}")
        if s.efa:
            self._tool("fi_info", f"printf '%s\\n' {' '.join(q(line) for line in FI_INFO_EFA)}")
        else:
            self._tool("fi_info", "echo 'fi_getinfo: -61 (No data available)' >&2; exit 1")
        if s.dcgm is not None:
            verdict = "Pass" if s.dcgm == "pass" else "Fail"
            code = 0 if s.dcgm == "pass" else 226
            self._tool("dcgmi", f"printf '%s\\n' {q(f'| Deployment: GPU Memory | {verdict} |')}; exit {code}")
        active = "failed" if s.restart_fails else "active"
        self._tool(
            "systemctl",
            f"""log={q(self.root / SYSTEMCTL_LOG)}
case "$1" in
  restart) echo "restart $2" >> "$log"; touch {q(self.root / RESTART_REQUEST)} ;;
  is-active) echo {active}; [ {active} = active ] ;;
  *) echo "$*" >> "$log" ;;
esac""",
        )

    def _nvidia_smi(self, data: Path) -> None:
        s = self.state
        (data / "smi-q.txt").write_text(nvidia_smi_q(s))
        (data / "nvlink.txt").write_text(nvlink_status(s))
        smi_exit = f"exit {TIMEOUT_EXIT}" if s.smi_timeout else ""
        self._tool(
            "nvidia-smi",
            f"""{smi_exit}
case "$*" in
  -q*) cat {q(data / "smi-q.txt")} ;;
  nvlink*) cat {q(data / "nvlink.txt")} ;;
  *) echo "unsupported by the simulated node: $*" >&2; exit 2 ;;
esac""",
        )

    def _tool(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n# {name}, as a simulated node answers (localrun/gpu_node.py)\n{body}\n")
        path.chmod(0o755)


def q(value: object) -> str:
    return shlex.quote(str(value))


BOOT_LINES = (
    "Linux version 6.1.0-1029-aws (buildd@lcy02-amd64-017) (gcc 12.3.0) #29-Ubuntu SMP",
    "nvidia: module verification failed: signature and/or required key missing - tainting kernel",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024",
    "efa 0000:10:1b.0: Setup irq:0x...",
)
FI_INFO_EFA = (
    "provider: efa",
    "    fabric: efa",
    "    domain: rdmap16s27-rdm",
    "    version: 120.10",
    "    type: FI_EP_RDM",
    "    protocol: FI_PROTO_EFA",
)
COLUMN = 42  # where nvidia-smi -q puts its colons


def _kv(depth: int, key: str, value: object) -> str:
    return f"{' ' * depth}{key:<{COLUMN - depth}}: {value}"


def nvidia_smi_q(state: NodeState) -> str:
    """`nvidia-smi -q` for the node's GPUs: a recent driver's layout, or an older one's (`legacy_driver`)."""
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", "Mon Nov 30 10:00:00 2026"),
        _kv(0, "Driver Version", "470.256.02" if state.legacy_driver else "535.183.01"),
        _kv(0, "CUDA Version", "11.4" if state.legacy_driver else "12.2"),
        "",
        _kv(0, "Attached GPUs", state.gpus),
    ]
    for index in range(state.gpus):
        ecc = state.ecc_uncorrectable if index == 0 else 0
        lines += [
            f"GPU 00000000:{BUS_IDS[index]}.0",
            _kv(4, "Product Name", "NVIDIA A100-SXM4-40GB"),
            _kv(4, "Persistence Mode", "Enabled"),
            "    MIG Mode",
            _kv(8, "Current", "Disabled"),
            _kv(8, "Pending", "Disabled"),
            "    ECC Mode",
            _kv(8, "Current", "Enabled"),
            _kv(8, "Pending", "Enabled"),
            "    ECC Errors",
            *(_legacy_ecc(ecc) if state.legacy_driver else _ecc(ecc)),
            "    Retired Pages",
            _kv(8, "Single Bit ECC", "N/A"),
            _kv(8, "Double Bit ECC", "N/A"),
            _kv(8, "Pending Page Blacklist", "N/A"),
            "    Remapped Rows",
            _kv(8, "Correctable Error", 0),
            _kv(8, "Uncorrectable Error", 1 if (state.remap_failure or state.remap_pending) and index == 0 else 0),
            _kv(8, "Pending", "Yes" if state.remap_pending and index == 0 else "No"),
            _kv(8, "Remapping Failure Occurred", "Yes" if state.remap_failure and index == 0 else "No"),
            "        Bank Remap Availability Histogram",
            _kv(12, "Max", "640 bank(s)"),
            _kv(12, "High", "0 bank(s)"),
            _kv(12, "Partial", "0 bank(s)"),
            _kv(12, "Low", "0 bank(s)"),
            _kv(12, "None", "0 bank(s)"),
            "    Temperature",
            _kv(8, "GPU Current Temp", "33 C"),
            "    Power Readings",
            _kv(8, "Power Draw", "59.26 W"),
            "",
        ]
    return "\n".join(lines) + "\n"


def _ecc(uncorrectable: int) -> list[str]:
    counts = [
        ("SRAM Correctable", 0),
        ("SRAM Uncorrectable Parity", 0),
        ("SRAM Uncorrectable SEC-DED", 0),
        ("DRAM Correctable", 0),
        ("DRAM Uncorrectable", uncorrectable),
    ]
    volatile = [_kv(12, key, value) for key, value in counts]
    aggregate = [_kv(12, key, value) for key, value in counts] + [_kv(12, "SRAM Threshold Exceeded", "No")]
    return ["        Volatile", *volatile, "        Aggregate", *aggregate]


def _legacy_ecc(uncorrectable: int) -> list[str]:
    parts = ("Device Memory", "Register File", "L1 Cache", "L2 Cache", "Texture Memory", "Texture Shared", "CBU")

    def bits(total: int) -> list[str]:
        return [_kv(16, part, total if part == "Device Memory" else 0) for part in parts] + [_kv(16, "Total", total)]

    block = ["            Single Bit", *bits(0), "            Double Bit", *bits(uncorrectable)]
    return ["        Volatile", *block, "        Aggregate", *block]


def nvlink_status(state: NodeState) -> str:
    """`nvidia-smi nvlink --status`: each GPU's links, the first `nvlink_inactive` of GPU 0 inactive."""
    lines = []
    for index in range(state.gpus):
        lines.append(f"GPU {index}: NVIDIA A100-SXM4-40GB (UUID: GPU-8f7c1d2e-0000-4000-8000-00000000000{index})")
        for link in range(NVLINKS_PER_GPU):
            down = index == 0 and link < state.nvlink_inactive
            lines.append(f"\t Link {link}: {'<inactive>' if down else '25 GB/s'}")
    return "\n".join(lines) + "\n"


# `neuron-ls --topology` on a trn1.32xlarge, its table as AWS's Neuron Runtime guide records it
# (aws-neuron/aws-neuron-sdk, neuron-runtime/nrt-api-guide.rst;
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/nrt-api-guide.html).
NEURON_LS_TRN1 = """instance-type: trn1.32xlarge
instance-id: i-0633517e496256bf8
+--------+--------+--------+---------------+---------+
| NEURON | NEURON | NEURON |   CONNECTED   |   PCI   |
| DEVICE | CORES  | MEMORY |    DEVICES    |   BDF   |
+--------+--------+--------+---------------+---------+
| 0      | 2      | 32 GB  | 12, 3, 4, 1   | 10:1c.0 |
| 1      | 2      | 32 GB  | 13, 0, 5, 2   | 10:1d.0 |
| 2      | 2      | 32 GB  | 14, 1, 6, 3   | a0:1c.0 |
| 3      | 2      | 32 GB  | 15, 2, 7, 0   | a0:1d.0 |
| 4      | 2      | 32 GB  | 0, 7, 8, 5    | 20:1b.0 |
| 5      | 2      | 32 GB  | 1, 4, 9, 6    | 20:1c.0 |
| 6      | 2      | 32 GB  | 2, 5, 10, 7   | 90:1b.0 |
| 7      | 2      | 32 GB  | 3, 6, 11, 4   | 90:1c.0 |
| 8      | 2      | 32 GB  | 4, 11, 12, 9  | 20:1d.0 |
| 9      | 2      | 32 GB  | 5, 8, 13, 10  | 20:1e.0 |
| 10     | 2      | 32 GB  | 6, 9, 14, 11  | 90:1d.0 |
| 11     | 2      | 32 GB  | 7, 10, 15, 8  | 90:1e.0 |
| 12     | 2      | 32 GB  | 8, 15, 0, 13  | 10:1e.0 |
| 13     | 2      | 32 GB  | 9, 12, 1, 14  | 10:1b.0 |
| 14     | 2      | 32 GB  | 10, 13, 2, 15 | a0:1e.0 |
| 15     | 2      | 32 GB  | 11, 14, 3, 12 | a0:1b.0 |
+--------+--------+--------+---------------+---------+"""


def neuron_ls(devices: int) -> str:
    """neuron-ls's table for a trn1.32xlarge that lists `devices` of its devices (the first ones)."""
    lines = NEURON_LS_TRN1.splitlines()
    header, rows, footer = lines[:6], lines[6:-1], lines[-1:]
    return "\n".join([*header, *rows[:devices], *footer]) + "\n"
