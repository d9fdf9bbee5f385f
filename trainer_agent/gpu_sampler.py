"""Host GPU liveness from NVML: power, utilization and memory utilization, averaged over the host's GPUs.

Sampled by the agent's background thread; handles are opened once and cached. Without pynvml
(nvidia-ml-py) or a driver, `take()` returns None and the host metrics carry only Heartbeat/StepTime.
A Neuron host's sampler is trainer_agent.neuron_sampler's, with the same `sample()`, `take()` and `close()`.
"""

from __future__ import annotations

from typing import Any

from trainer_agent.log import logger
from trainer_agent.window import AcceleratorReading

MILLIWATTS_PER_WATT = 1000.0


class GpuSampler:
    """Accumulates NVML samples between `take()` calls."""

    gpus = True
    """Its readings are GPUs': the host window carries the metrics' old GPU names too (window.with_old_names)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._opened = False
        self._sums = [0.0, 0.0, 0.0]
        self._samples = 0

    def sample(self) -> None:
        """Read every GPU once (a few microseconds each); errors disable the sampler."""
        if not self._opened:
            self._open()
        if not self._handles:
            return
        try:
            readings = [self._read(handle) for handle in self._handles]
        except Exception as error:  # an NVML error (e.g. GPU fallen off the bus) must not stop the heartbeat
            logger.warning("NVML read failed, GPU metrics stop: %s", error)
            self._handles = []
            return
        for index in range(3):
            self._sums[index] += sum(reading[index] for reading in readings) / len(readings)
        self._samples += 1

    def take(self) -> AcceleratorReading | None:
        """The means since the last take, or None without samples."""
        if not self._samples:
            return None
        power, utilization, memory = (total / self._samples for total in self._sums)
        self._sums, self._samples = [0.0, 0.0, 0.0], 0
        return AcceleratorReading(utilization=utilization, memory_utilization=memory, power_watts=power)

    def close(self) -> None:
        """Nothing to release: NVML stays initialised for the process."""

    def _open(self) -> None:
        self._opened = True
        try:
            import pynvml  # imported here: optional (nvidia-ml-py), and only the host reporter needs it

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as error:  # no pynvml, no driver: GPU metrics are simply absent
            logger.info("NVML unavailable, no GPU host metrics: %s", error)

    def _read(self, handle: Any) -> tuple[float, float, float]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        watts = self._nvml.nvmlDeviceGetPowerUsage(handle) / MILLIWATTS_PER_WATT
        return watts, float(rates.gpu), float(rates.memory)
