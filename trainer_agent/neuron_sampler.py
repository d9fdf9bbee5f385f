"""Host NeuronCore liveness: neuron-monitor's utilization and memory, the driver's power, averaged over a window.

The host reporter's background thread calls `sample()` (as it does NVML's, trainer_agent.gpu_sampler); the first call
starts `neuron-monitor` with a configuration of two metric groups every SAMPLE_PERIOD, read line by line on a thread
of its own. Without neuron-monitor (aws-neuronx-tools) utilization and memory are absent and power still is read;
`close()` ends the monitor, and so does the pipe breaking when the training process goes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from trainer_agent.log import logger
from trainer_agent.neuron import NeuronReport, read_power, read_report
from trainer_agent.window import AcceleratorReading

MONITOR = "neuron-monitor"
MONITOR_DIR = "/opt/aws/neuron/bin"  # where aws-neuronx-tools installs it, off PATH on some images
SAMPLE_PERIOD = "15s"  # a report of 32 applications takes milliseconds to read: often enough for 60 s windows
MONITOR_CONFIG = {
    "period": SAMPLE_PERIOD,
    "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used"}]}],
}
MAX_REPORT_BYTES = 8 << 20
"""A longer line is not a report (one of 32 applications with their loaded models is a few hundred KB)."""


class NeuronSampler:
    """Accumulates neuron-monitor's reports and the driver's power between `take()` calls."""

    gpus = False
    """Its readings are NeuronCores': the host window carries only the accelerator names."""

    def __init__(self, root: Path | None = None, command: Sequence[str] | None = None) -> None:
        """`root`: the driver's sysfs (trainer_agent.neuron.SYSFS_ROOT); `command`: neuron-monitor and any arguments
        before its `-c <config>` (default: found on PATH or in /opt/aws/neuron/bin)."""
        self._root = root
        self._command = list(command) if command is not None else _find_monitor()
        self._lock = threading.Lock()
        self._latest: NeuronReport | None = None
        self._reports = 0
        self._taken = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._config: str | None = None
        self._started = False
        self._closed = False
        self._sums: dict[str, list[float]] = {name: [0.0, 0.0] for name in ("utilization", "memory", "power")}

    def sample(self) -> None:
        """Fold the newest report (if one came since the last sample) and the power into the window's means."""
        if not self._started:
            self._start()
        with self._lock:
            report = self._latest if self._reports != self._taken else None
            self._taken = self._reports
        if report is not None:
            self._add("utilization", report.utilization)
            self._add("memory", report.memory_utilization)
        self._add("power", read_power(self._root))

    def take(self) -> AcceleratorReading | None:
        """The means since the last take, or None without any reading."""
        means = {name: total / count if count else None for name, (total, count) in self._sums.items()}
        self._sums = {name: [0.0, 0.0] for name in self._sums}
        if all(value is None for value in means.values()):
            return None
        return AcceleratorReading(
            utilization=means["utilization"], memory_utilization=means["memory"], power_percent=means["power"]
        )

    def close(self) -> None:
        """End neuron-monitor (its reader reaps it) and remove its configuration file; never waits."""
        with self._lock:
            self._closed = True
            process, config = self._process, self._config
        if process is not None and process.poll() is None:
            process.terminate()
        if config is not None:
            Path(config).unlink(missing_ok=True)

    def _add(self, name: str, value: float | None) -> None:
        if value is not None:
            self._sums[name][0] += value
            self._sums[name][1] += 1

    def _start(self) -> None:
        self._started = True
        if not self._command:
            logger.info("neuron-monitor not found (aws-neuronx-tools): no NeuronCore utilization or memory")
            return
        try:
            descriptor, config = tempfile.mkstemp(prefix="stallwatch-neuron-monitor-", suffix=".json")
            with os.fdopen(descriptor, "w") as file:
                json.dump(MONITOR_CONFIG, file)
            process = subprocess.Popen(
                [*self._command, "-c", config], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=None
            )
        except Exception as error:  # a tool that will not start must not stop the heartbeat
            logger.warning("neuron-monitor did not start, no NeuronCore utilization or memory: %r", error)
            return
        with self._lock:
            self._process, self._config = process, config
            closed = self._closed
        if closed:  # closed while starting: end it at once
            self.close()
            return
        threading.Thread(target=self._read, args=(process,), name="stallwatch-neuron", daemon=True).start()

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        """Each line neuron-monitor writes, read as a report (a line that is not one is skipped), until it ends."""
        stream: IO[bytes] = process.stdout  # type: ignore[assignment] # a pipe: Popen(stdout=PIPE)
        partial = False
        for line in iter(lambda: stream.readline(MAX_REPORT_BYTES), b""):
            whole = line.endswith(b"\n")
            if not partial and whole:
                self._take_line(line)
            partial = not whole
        process.wait()
        if not self._closed:
            logger.warning(
                "neuron-monitor ended (exit %s): no more NeuronCore utilization or memory", process.returncode
            )

    def _take_line(self, line: bytes) -> None:
        try:
            data = json.loads(line)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        report = read_report(data)
        with self._lock:
            self._latest = report
            self._reports += 1


def _find_monitor() -> list[str]:
    found = shutil.which(MONITOR) or shutil.which(MONITOR, path=MONITOR_DIR)
    return [found] if found else []
