"""Values that resolve later, read without ever synchronizing host and device.

Step ends on CUDA are events queried non-blocking; losses are detached on the loop's thread and
read when the window rolls (CUDA losses through an async copy into pinned memory, read once its
event has completed). Anything not ready yet rolls into the next window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from trainer_agent.log import warn_once

# Fold CPU loss tensors into one stacked tensor past this many, so a long window holds few objects.
FOLD_LOSSES_AT = 1024


@dataclass(frozen=True)
class CompletedStep:
    """A step the device has finished."""

    step: int
    ended_at: float
    """perf_counter() when the loop left step()."""
    duration_s: float | None
    tokens: int
    samples: int
    busy_s: float = 0.0
    """Busy time this step adds to its window (on CUDA: device time not yet counted while it was open)."""


class CudaStepEvents:
    """Start/end CUDA events per step; `completed()` pops the steps whose end event has completed."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._free: list[Any] = []
        self._start: Any = None
        self._pending: deque[tuple[Any, Any, int, float, int, int, float]] = deque()

    @property
    def pending(self) -> int:
        """Steps ended on the host and not yet seen complete on the device."""
        return len(self._pending)

    def start(self) -> None:
        self.abort()
        self._start = self._event()
        self._start.record()

    def end(self, step: int, ended_at: float, tokens: int, samples: int, counted_s: float = 0.0) -> None:
        """End the step; `counted_s` of it was already counted as busy while it was open."""
        start, self._start = self._start, None
        if start is None:
            return
        end = self._event()
        end.record()
        self._pending.append((start, end, step, ended_at, tokens, samples, counted_s))

    def abort(self) -> None:
        if self._start is not None:
            self._free.append(self._start)
            self._start = None

    def completed(self) -> list[CompletedStep]:
        done = []
        while self._pending and self._pending[0][1].query():
            start, end, step, ended_at, tokens, samples, counted_s = self._pending.popleft()
            duration = start.elapsed_time(end) / 1000.0
            done.append(CompletedStep(step, ended_at, duration, tokens, samples, max(duration - counted_s, 0.0)))
            self._free += (start, end)
        return done

    def _event(self) -> Any:
        return self._free.pop() if self._free else self._torch.cuda.Event(enable_timing=True)


class LossBuffer:
    """Losses recorded in the loop. `add` never reads a tensor's value; `take` returns the values ready so far."""

    def __init__(self) -> None:
        self._floats: list[float] = []
        self._tensors: list[Any] = []
        self._cuda: deque[tuple[Any, Any]] = deque()
        self._pinned: list[Any] = []

    def add(self, loss: Any) -> None:
        """Keep a loss to read later; one that cannot be read without a collective or a copy from nowhere
        (a meta tensor, a sharded DTensor, an empty tensor) is dropped with one log line."""
        if not hasattr(loss, "detach"):
            self._floats.append(float(loss))
            return
        value = readable(loss.detach())
        if value is None:
            return
        if value.dim() != 0:
            value = value.float().mean()
        if value.is_cuda:
            self._copy_from_cuda(value)
            return
        self._tensors.append(value)
        if len(self._tensors) >= FOLD_LOSSES_AT:
            self._tensors = [_stack(self._tensors)]

    def take(self) -> tuple[list[float], list[Any]]:
        """The float losses, CUDA losses that have landed, and the CPU tensors still to read (see `read`)."""
        floats, tensors = self._floats, self._tensors
        self._floats, self._tensors = [], []
        while self._cuda and self._cuda[0][1].query():
            pinned, event = self._cuda.popleft()
            floats.append(pinned.item())  # a CPU tensor whose copy has completed: no device sync
            self._pinned.append((pinned, event))
        return floats, tensors

    def _copy_from_cuda(self, value: Any) -> None:
        import torch  # imported here: only CUDA losses need it, and torch is then loaded

        if self._pinned:
            pinned, event = self._pinned.pop()
        else:
            pinned, event = torch.empty((), dtype=torch.float32, pin_memory=True), torch.cuda.Event()
        pinned.copy_(value.float(), non_blocking=True)
        event.record()
        self._cuda.append((pinned, event))


def readable(value: Any) -> Any:
    """A plain tensor holding the loss's value, or None (logged once) when the agent must not read it."""
    if type(value).__name__ == "DTensor":
        if not all(placement.is_replicate() for placement in value.placements):
            warn_once("loss:dtensor", "trainer_agent: a sharded or partial DTensor loss needs a collective; dropped")
            return None
        value = value.to_local()  # replicated: this rank's copy is the value
    if value.device.type == "meta" or not value.numel():
        warn_once(
            f"loss:{type(value).__name__}:{value.device.type}",
            "trainer_agent: a %s loss on %s with %d elements cannot be read; dropped",
            type(value).__name__,
            value.device.type,
            value.numel(),
        )
        return None
    return value


def read(tensors: list[Any]) -> list[float]:
    """Read CPU loss tensors in one call (at window roll, off the loop's thread)."""
    if not tensors:
        return []
    return [float(value) for value in _stack(tensors).tolist()]


def _stack(tensors: list[Any]) -> Any:
    import torch  # imported here: tensors were recorded, so torch is loaded

    # Each entry is a recorded 0-d loss or an earlier fold (1-d).
    return torch.cat([tensor.float().reshape(-1) for tensor in tensors])
