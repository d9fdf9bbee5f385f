"""One emission window: what the agent tallied, and the metrics it becomes (pure arithmetic, no torch).

totals = WindowTotals(wall_s=60.0, steps=120, tokens=8 * 120 * 8192, busy_s=57.0)
job_metrics(totals, Progress(step=1200, last_step_age_s=0.4), Scale(world_size=8, flops_per_token=6e9))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainer_agent.contract import RENAMED_METRICS, SCOPE_HOST, SCOPE_JOB

TERA = 1e12


@dataclass(frozen=True)
class Window:
    """The metrics of one window, as the sinks receive them."""

    scope: str
    """SCOPE_JOB (dimension JobName) or SCOPE_HOST (dimensions JobName and Host)."""
    t: float
    """Unix time at the window's end."""
    job: str
    host: str
    rank: int
    interval_s: float
    """The agent's emission interval (sets the CloudWatch storage resolution)."""
    metrics: dict[str, float]
    """Contract metric name -> value; a metric without a value this window is absent."""
    phase: str | None = None
    """The declared phase running at emission, if any."""

    def __post_init__(self) -> None:
        if self.scope not in (SCOPE_JOB, SCOPE_HOST):
            raise ValueError(f"scope must be {SCOPE_JOB!r} or {SCOPE_HOST!r}, not {self.scope!r}")

    def as_record(self) -> dict[str, object]:
        """A flat JSON-ready record: t, job, host, rank, scope, phase and the metrics."""
        record: dict[str, object] = {"t": self.t, "job": self.job, "host": self.host, "rank": self.rank}
        record |= {"scope": self.scope, "phase": self.phase} | self.metrics
        return record


@dataclass
class WindowTotals:
    """What this process tallied in one window: its steps and times, and the job's tokens and samples."""

    wall_s: float = 0.0
    """Window length in seconds."""
    steps: int = 0
    """Steps completed (on CUDA: confirmed complete on the device)."""
    step_seconds: float = 0.0
    """Sum of the timed steps' durations."""
    timed_steps: int = 0
    tokens: int = 0
    """Tokens the whole job consumed in the window's steps (this rank's times the data-parallel ranks)."""
    samples: int = 0
    """Samples the whole job consumed, likewise."""
    busy_s: float = 0.0
    """Time inside step() or a declared phase."""
    losses: list[float] = field(default_factory=list)
    counts_tokens: bool = False
    """The loop has reported tokens (so a window without any is 0 tokens/s, not unknown)."""
    counts_samples: bool = False


@dataclass(frozen=True)
class Progress:
    """Where the job stands at emission."""

    step: int
    last_step_age_s: float
    phase_budget_remaining_s: float = 0.0
    eta_s: float | None = None


@dataclass(frozen=True)
class Scale:
    """The job's shape and FLOPs: how one rank's counts become the job's, and its FLOPs each accelerator's."""

    world_size: int = 1
    data_parallel_size: int | None = None
    """Ranks that each consume distinct data; default world_size (pure data parallelism)."""
    flops_per_step: float | None = None
    """Model FLOPs of one step on this rank."""
    flops_per_token: float | None = None
    """Model FLOPs of one token (forward and backward), for the whole model."""
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of one rank's accelerator (a GPU, or a NeuronCore)."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, not {self.world_size}")
        if self.data_parallel_size is not None and not 1 <= self.data_parallel_size <= self.world_size:
            raise ValueError(f"data_parallel_size must be within 1..{self.world_size}, not {self.data_parallel_size}")
        for name in ("flops_per_step", "flops_per_token", "peak_tflops"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, not {value!r}")
        if self.flops_per_step is not None and self.flops_per_token is not None:
            raise ValueError("give flops_per_step or flops_per_token, not both")

    @property
    def data_ranks(self) -> int:
        return self.data_parallel_size or self.world_size


def job_metrics(totals: WindowTotals, progress: Progress, scale: Scale) -> dict[str, float]:
    """The job metrics of a window (see trainer_agent.contract.JOB_METRICS); Steps is always present."""
    wall = max(totals.wall_s, 1e-9)
    metrics: dict[str, float] = {
        "Steps": float(totals.steps),
        "Step": float(progress.step),
        "LastStepAge": max(progress.last_step_age_s, 0.0),
        "DataWaitFraction": 100.0 * min(max(wall - totals.busy_s, 0.0) / wall, 1.0),
        "PhaseBudgetRemaining": max(progress.phase_budget_remaining_s, 0.0),
    }
    if totals.timed_steps:
        metrics["StepTime"] = totals.step_seconds / totals.timed_steps
    if totals.counts_tokens:
        metrics["TokensPerSecond"] = totals.tokens / wall
    if totals.counts_samples:
        metrics["SamplesPerSecond"] = totals.samples / wall
    flops = _window_flops(totals, scale)
    if flops is not None:
        metrics["TFLOPsPerAccelerator"] = flops / wall / TERA
        if scale.peak_tflops is not None:
            metrics["MFU"] = 100.0 * metrics["TFLOPsPerAccelerator"] / scale.peak_tflops
    if totals.losses:
        finite = [loss for loss in totals.losses if math.isfinite(loss)]
        metrics["NonFiniteLoss"] = float(len(totals.losses) - len(finite))
        if finite:
            metrics["Loss"] = math.fsum(finite) / len(finite)
    if progress.eta_s is not None:
        metrics["ETA"] = max(progress.eta_s, 0.0)
    return metrics


@dataclass(frozen=True)
class AcceleratorReading:
    """Means over a host's accelerators (GPUs, or NeuronCores) and over the window's samples; None: not read."""

    utilization: float | None = None
    memory_utilization: float | None = None
    power_watts: float | None = None
    power_percent: float | None = None
    """Power as a percentage of the device's maximum, where the tools give no watts (the Neuron driver)."""


def host_metrics(totals: WindowTotals, reading: AcceleratorReading | None) -> dict[str, float]:
    """The host metrics of a window (see trainer_agent.contract.HOST_METRICS); Heartbeat is always 1."""
    metrics = {"Heartbeat": 1.0}
    if reading is not None:
        values = {
            "AcceleratorUtilization": reading.utilization,
            "AcceleratorMemoryUtilization": reading.memory_utilization,
            "AcceleratorPowerWatts": reading.power_watts,
            "AcceleratorPowerPercent": reading.power_percent,
        }
        metrics |= {name: value for name, value in values.items() if value is not None}
    if totals.timed_steps:
        metrics["StepTime"] = totals.step_seconds / totals.timed_steps
    return metrics


def with_old_names(metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` with each renamed metric under its old name too (contract.RENAMED_METRICS): what a GPU's windows
    carry for one release, so that alarms and dashboards on the old names go on reading."""
    return metrics | {old: metrics[new] for old, new in RENAMED_METRICS.items() if new in metrics}


def _window_flops(totals: WindowTotals, scale: Scale) -> float | None:
    """Model FLOPs one device did in the window."""
    if scale.flops_per_step is not None:
        return scale.flops_per_step * totals.steps
    if scale.flops_per_token is not None and totals.counts_tokens:
        # The job's tokens times the per-token FLOPs, shared by every rank (data, tensor or pipeline parallel).
        return scale.flops_per_token * totals.tokens / scale.world_size
    return None
