"""Trainium: the NeuronCore a rank drives and its peak, neuron-monitor's reports and the driver's power as host
metrics, and the agent on XLA (no GPU names where there is no GPU)."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest

from trainer_agent import neuron
from trainer_agent.neuron import core_name, read_power, read_report
from trainer_agent.neuron_sampler import NeuronSampler
from trainer_agent.peaks import peak_tflops

# AWS's Neuron Monitor User Guide (aws-neuron/aws-neuron-sdk, tools/neuron-sys-tools/neuron-monitor-user-guide.rst;
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/neuron-monitor-user-guide.html):
# its trn2n.48xlarge samples of `neuron_hardware_info`, `neuroncore_counters` (the guide's "[...]" after core "1" left
# out) and `memory_used`'s totals (its breakdown and loaded models left out), verbatim.
TRN2_HARDWARE_INFO = """{
  "neuron_device_type": "trainium2",
  "neuron_device_version": "v4",
  "neuroncore_version": "v3d",
  "neuron_device_count": 16,
  "neuron_device_memory_size": 103079215104,
  "neuroncore_per_device_count": 4,
  "logical_neuroncore_config": 2,
  "error": ""
}"""
TRN2_NEURONCORE_COUNTERS = """{
  "period": 1.000113182,
  "neuroncores_in_use": {
    "0": {
      "neuroncore_utilization": 42.01,
      "flops": 1234567891011,
      "v3d": {
        "nc_v3.0": {
          "neuroncore_utilization": 21.01
        },
        "nc_v3.1": {
          "neuroncore_utilization": 63.01
        }
      }
    },
    "1": {
      "neuroncore_utilization": 42.02,
      "flops": 1234567891021,
      "v3d": {
        "nc_v3.2": {
          "neuroncore_utilization": 21.02
        },
        "nc_v3.3": {
          "neuroncore_utilization": 63.02
        }
      }
    }
  },
  "error": ""
}"""
TRN2_RUNTIME_USED_BYTES = """{
  "host": 6997643264,
  "neuron_device": 12519788544
}"""
# The same guide, as it stood for trn1 (commit 9533ba4): `neuron_hardware_info` without the devices' memory size.
TRN1_ERA_HARDWARE_INFO = """{
  "neuron_device_count": 16,
  "neuroncore_per_device_count": 4,
  "error": ""
}"""
TRN1_ERA_NEURONCORE_COUNTERS = """{
  "period": 1.000113182,
  "neuroncores_in_use": {
    "0": {"neuroncore_utilization": 42.01},
    "1": {"neuroncore_utilization": 42.02},
    "2": {"neuroncore_utilization": 42.03},
    "3": {"neuroncore_utilization": 42.04}
  },
  "error": ""
}"""
# The driver's sysfs power line on an idle trn1.2xlarge (Trainium1, driver 2.26.5.0), recorded in
# https://github.com/lablup/all-smi/pull/417; its format is the Neuron Sysfs User Guide's
# (<status>,<timestamp>,<min_power>,<max_power>,<avg_power>, each power in % of the device's maximum).
TRN1_IDLE_POWER = "POWER_STATUS_VALID,1789180860,0.00,0.00,0.00"


def report(hardware: str, counters: str, used_bytes: str | None = None) -> dict:
    """A neuron-monitor report of one Neuron application with the quoted groups."""
    groups = {"neuroncore_counters": json.loads(counters)}
    if used_bytes is not None:
        groups["memory_used"] = {"period": 1.00001, "neuron_runtime_used_bytes": json.loads(used_bytes), "error": ""}
    runtime = {"pid": 4242, "neuron_runtime_tag": "my_app_1", "error": "", "report": groups}
    return {"neuron_runtime_data": [runtime], "neuron_hardware_info": json.loads(hardware)}


def sysfs(root: Path, arch: str, power: list[str]) -> Path:
    """The driver's sysfs as a host with one Neuron device per `power` line shows it."""
    for index, line in enumerate(power):
        device = root / f"neuron{index}"
        (device / "stats/power").mkdir(parents=True)
        (device / "stats/power/utilization").write_text(line + "\n")
        (device / "neuron_core0/info/architecture").mkdir(parents=True)
        (device / "neuron_core0/info/architecture/arch_type").write_text(arch + "\n")
    return root


def test_a_trn2_report_is_its_cores_mean_utilization_over_the_host_and_its_memory_over_the_devices():
    # When the guide's trn2 report is read
    read = read_report(report(TRN2_HARDWARE_INFO, TRN2_NEURONCORE_COUNTERS, TRN2_RUNTIME_USED_BYTES))

    # Then utilization is per NeuronCore of the host (16 devices x 4 logical cores, two of them busy)
    assert read.utilization == pytest.approx((42.01 + 42.02) / 64)
    # And memory is the device memory held over the 16 devices' 96 GiB each
    assert read.memory_utilization == pytest.approx(100 * 12519788544 / (16 * 103079215104))


def test_a_report_without_the_devices_memory_size_has_utilization_and_no_memory():
    read = read_report(report(TRN1_ERA_HARDWARE_INFO, TRN1_ERA_NEURONCORE_COUNTERS, TRN2_RUNTIME_USED_BYTES))
    assert read.utilization == pytest.approx((42.01 + 42.02 + 42.03 + 42.04) / 64)
    assert read.memory_utilization is None


def test_cores_of_several_applications_count_once_each_and_a_host_without_applications_is_idle():
    # Given two applications, each on its own cores (a rank a core), as neuron-monitor lists every one's cores
    first = report(TRN1_ERA_HARDWARE_INFO, TRN1_ERA_NEURONCORE_COUNTERS)
    second = json.loads(json.dumps(first["neuron_runtime_data"][0]))
    second["report"]["neuroncore_counters"]["neuroncores_in_use"] = {"4": {"neuroncore_utilization": 90.0}}
    first["neuron_runtime_data"].append(second)

    # Then the host's mean counts each core once; and once the applications are gone, the host reads idle, not unknown
    assert read_report(first).utilization == pytest.approx((42.01 + 42.02 + 42.03 + 42.04 + 90.0) / 64)
    gone = {"neuron_runtime_data": [], "neuron_hardware_info": json.loads(TRN1_ERA_HARDWARE_INFO)}
    assert read_report(gone).utilization == 0.0


@pytest.mark.parametrize(
    "malformed",
    [{}, {"neuron_runtime_data": "x"}, {"neuron_runtime_data": [{"report": {"neuroncore_counters": [1]}}]}],
)
def test_a_malformed_report_reads_as_absent_never_raises(malformed):
    read = read_report(malformed)
    assert (read.utilization, read.memory_utilization) == (None, None)


def test_power_is_the_valid_devices_mean_percent_of_their_maximum(tmp_path):
    # Given an idle trn1 device's recorded line, a loaded one's, and one whose sampling failed
    lines = [TRN1_IDLE_POWER, "POWER_STATUS_VALID,1789180860,0.86,25.00,18.86", "POWER_STATUS_NO_DATA,0,0,0,0"]
    root = sysfs(tmp_path, "NCv2", lines)

    # Then power is the mean of the two valid devices' averages; a host without the driver has none
    assert read_power(root) == pytest.approx((0.0 + 18.86) / 2)
    assert read_power(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("arch", "lnc", "name", "bf16"),
    [
        ("NCv2", None, "NeuronCore-v2", 95.0),  # trn1: a Trainium chip's 190 TFLOPS over its two NeuronCores
        ("NCv3", None, "NeuronCore-v3 LNC=2", 166.75),  # trn2: 667 over 8 physical cores, two in a logical one
        ("NCv3", "1", "NeuronCore-v3", 83.375),
    ],
)
def test_the_neuroncore_a_rank_drives_has_its_per_core_peak(tmp_path, arch, lnc, name, bf16):
    root = sysfs(tmp_path, arch, [TRN1_IDLE_POWER])
    environ = {} if lnc is None else {neuron.LNC_ENV: lnc}
    assert core_name(root, environ) == name
    assert peak_tflops(name, "bf16") == bf16
    assert core_name(tmp_path / "absent", environ) is None


def fake_monitor(tmp_path: Path, lines: list[str]) -> list[str]:
    """A neuron-monitor that keeps its configuration, writes `lines` and runs until ended, as the real one does."""
    (tmp_path / "reports.jsonl").write_text("".join(line + "\n" for line in lines))
    script = tmp_path / "neuron-monitor"
    script.write_text(
        f'#!/bin/sh\n[ "$1" = -c ] && cp "$2" {tmp_path / "config.json"}\ncat {tmp_path / "reports.jsonl"}\n'
        "exec sleep 60\n"
    )
    script.chmod(0o755)
    return [str(script)]


def sample_until_read(sampler: NeuronSampler, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sampler.sample()
        reading = sampler.take()
        if reading is not None and reading.utilization is not None:
            return reading
        time.sleep(0.05)
    raise AssertionError("neuron-monitor's report never arrived")


def test_the_sampler_reads_neuron_monitors_reports_and_the_drivers_power_and_ends_the_monitor(tmp_path):
    # Given a trn2 host: its driver's sysfs, and neuron-monitor writing a line that is no report, then the guide's
    root = sysfs(tmp_path / "sys", "NCv3", [TRN1_IDLE_POWER, "POWER_STATUS_VALID,1789180860,0.86,25.00,18.86"])
    good = json.dumps(report(TRN2_HARDWARE_INFO, TRN2_NEURONCORE_COUNTERS, TRN2_RUNTIME_USED_BYTES))
    sampler = NeuronSampler(root, fake_monitor(tmp_path, ["not a report", good]))

    # When it samples until the report is in
    reading = sample_until_read(sampler)

    # Then the window has the cores' utilization and memory, and the devices' power in % of their maximum
    assert reading.utilization == pytest.approx((42.01 + 42.02) / 64)
    assert reading.memory_utilization == pytest.approx(100 * 12519788544 / (16 * 103079215104))
    assert reading.power_percent == pytest.approx(18.86 / 2)
    assert reading.power_watts is None
    # And neuron-monitor was asked for the two groups it needs, every 15 s
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["period"] == "15s"
    assert [m["type"] for m in config["neuron_runtimes"][0]["metrics"]] == ["neuroncore_counters", "memory_used"]

    # When it closes, neuron-monitor ends
    process = sampler._process
    sampler.close()
    assert process is not None
    process.wait(10.0)


def test_without_neuron_monitor_power_is_still_read(tmp_path):
    root = sysfs(tmp_path, "NCv2", [TRN1_IDLE_POWER])
    sampler = NeuronSampler(root, command=[])
    sampler.sample()
    reading = sampler.take()
    assert reading is not None
    assert (reading.utilization, reading.memory_utilization, reading.power_percent) == (None, None, 0.0)
    assert sampler.take() is None


def test_an_agent_on_trainium_reports_neuroncores_with_their_peak_and_no_gpu_names(
    monkeypatch, make_agent, sink, clock, tmp_path
):
    # Given a trn1 host (the driver's sysfs, neuron-monitor) and torch-neuronx's XLA imported, no CUDA
    root = sysfs(tmp_path / "sys", "NCv2", [TRN1_IDLE_POWER])
    monkeypatch.setattr(neuron, "SYSFS_ROOT", root)
    command = fake_monitor(tmp_path, [json.dumps(report(TRN1_ERA_HARDWARE_INFO, TRN1_ERA_NEURONCORE_COUNTERS))])
    monkeypatch.setattr("trainer_agent.neuron_sampler._find_monitor", lambda: command)
    monkeypatch.setitem(sys.modules, "torch_xla", types.ModuleType("torch_xla"))

    # When a 1 s step of 95e12 FLOPs runs, and windows go out until one has neuron-monitor's report
    agent = make_agent(flops_per_step=95e12)
    with agent.step():
        clock.advance(1.0)
    deadline = time.monotonic() + 20.0
    while "AcceleratorUtilization" not in (sink.host[-1].metrics if sink.host else {}):
        assert time.monotonic() < deadline, "neuron-monitor's report never reached a window"
        agent._accelerators.sample()
        agent.flush()

    # Then the device is XLA, and MFU is against one NeuronCore-v2's 95 TFLOPS (not a chip's 190)
    assert agent.device == "xla"
    job = sink.job[0].metrics
    assert job["TFLOPsPerAccelerator"] == pytest.approx(95.0)
    assert job["MFU"] == pytest.approx(100.0)
    # And the host window has the cores' utilization and power, and no metric says GPU
    host = sink.host[-1].metrics
    assert host["AcceleratorUtilization"] == pytest.approx((42.01 + 42.02 + 42.03 + 42.04) / 64)
    assert host["AcceleratorPowerPercent"] == 0.0
    assert not [name for window in sink.windows for name in window.metrics if "GPU" in name]
