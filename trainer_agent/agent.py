"""TrainerAgent: progress, throughput, TFLOPs/MFU and phases measured inside the training loop.

    agent = TrainerAgent(flops_per_token=6 * n_params, total_steps=10_000, interval_s=60)
    for batch in loader:
        with agent.step(tokens=batch.numel(), samples=len(batch)):
            loss = train_step(batch)
        agent.record(loss=loss)              # a tensor is never read in the loop
    with agent.phase("checkpoint", budget_s=900):
        save_checkpoint()
    agent.close()

step() and record() never synchronize host and device, and no method raises into the loop: a
failure is logged once and training goes on. A background thread emits one window every interval_s,
with Steps=0 when the loop is stuck. SIGTERM flushes the last window within 2 s even while the loop is
blocked in a collective (see trainer_agent.sigterm), and so does interpreter exit. On every rank, a stall
(no step for a while) writes every thread's stack once (see trainer_agent.stack_dumps), and so does SIGTERM
while the loop is blocked.

Kept whole (over 500 lines): the training loop's one import; `TrainerAgent` and its window thread share
its state and lock, which a split would expose.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from trainer_agent import neuron, sigterm
from trainer_agent.contract import SCOPE_HOST, SCOPE_JOB
from trainer_agent.gpu_sampler import GpuSampler
from trainer_agent.identity import Identity
from trainer_agent.log import logger, warn_once
from trainer_agent.neuron_sampler import NeuronSampler
from trainer_agent.peaks import peak_tflops as table_peak_tflops
from trainer_agent.peaks import precision_key
from trainer_agent.pending import CompletedStep, CudaStepEvents, LossBuffer, read
from trainer_agent.sinks import AUTO, Sink, build_sinks
from trainer_agent.stack_dumps import StackWatch, StallDumps
from trainer_agent.window import (
    Progress,
    Scale,
    Window,
    WindowTotals,
    host_metrics,
    job_metrics,
    with_old_names,
)

DEFAULT_INTERVAL_S = 60.0
MIN_INTERVAL_S = 1.0
ACCELERATOR_SAMPLE_S = 5.0
"""NVML (or neuron-monitor's newest report) is sampled this often (or once per window if shorter) and averaged over
the window."""
DEVICES = ("cuda", "xla", "cpu")
"""The devices the loop may run on: CUDA (its step ends timed by CUDA events), XLA (torch-neuronx on Trainium; the
host's times) and the CPU."""
THREAD_JOIN_S = 2.0
"""close() waits this long, and at most a quarter of its timeout, for the background thread to stop (it may be
stuck in NVML on a failing GPU): the final window needs the rest of the time for the sinks."""
FLUSH_TIMEOUT_S = 1.0
"""flush() waits at most this long for the sinks to take the window (a blocked sink costs the caller no more)."""
CLOSE_TIMEOUT_S = 10.0
"""close() waits at most this long for the sinks (SIGTERM: sigterm.FLUSH_S)."""

_Method = TypeVar("_Method", bound=Callable[..., Any])
_agents: weakref.WeakSet[TrainerAgent] = weakref.WeakSet()


def _never_raises(method: _Method) -> _Method:
    """Log a failure once per method and return None: the agent never breaks the training loop."""

    @functools.wraps(method)
    def guarded(self: TrainerAgent, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            warn_once(f"agent:{method.__name__}", "trainer_agent: %s failed, carrying on: %r", method.__name__, error)
            return None

    return guarded  # type: ignore[return-value]


class TrainerAgent:
    """Measures the loop on every rank that reports (global rank 0: job metrics; local rank 0: host metrics)."""

    def __init__(
        self,
        job_name: str | None = None,
        flops_per_step: float | None = None,
        flops_per_token: float | None = None,
        peak_tflops: float | None = None,
        total_steps: int | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        sinks: str | list[Sink] = AUTO,
        *,
        precision: object = "bf16",
        data_parallel_size: int | None = None,
        device: str | None = None,
        handle_sigterm: bool = True,
        stall_dumps: StallDumps | None = StallDumps(),  # noqa: B008 - frozen, shared safely
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """
        Args:
            job_name: the JobName dimension; default as `Identity.detect` finds it (see trainer_agent.identity).
            flops_per_step: model FLOPs of one optimizer step on this rank (forward + backward).
            flops_per_token: ...or per token for the whole model (see trainer_agent.flops); needs step(tokens=).
            peak_tflops: peak TFLOP/s of one rank's device; default from trainer_agent.peaks for `precision` (a GPU,
                or on XLA the NeuronCore the Neuron driver names).
            total_steps: enables ETA.
            interval_s: the emission window in seconds (< 60 publishes high-resolution metrics).
            sinks: "auto" (CloudWatch when boto3 and credentials exist, plus the EMF stdout line) or a list.
            precision: the precision MFU is relative to ("bf16", "fp16", "tf32", "fp32", "fp8").
            data_parallel_size: ranks consuming distinct data (default: world size, as DDP and FSDP have);
                step(tokens=, samples=) are this rank's and count data_parallel_size times.
            device: "cuda", "xla" or "cpu"; default "cuda" when torch is imported and CUDA is available, else "xla"
                when torch_xla is imported (torch-neuronx imports it), else "cpu".
            handle_sigterm: flush the last window on SIGTERM, then let the previous disposition apply.
            stall_dumps: when every rank writes its threads' stacks (once per stall, and at SIGTERM while the loop
                is blocked) to the sinks that take them; None: never.
            clock: monotonic seconds for step and window timing (a fake one in tests).
        """
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be >= {MIN_INTERVAL_S}, not {interval_s}")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, not {total_steps}")
        self.identity = Identity.detect(job_name)
        self.interval_s = float(interval_s)
        self.total_steps = total_steps
        self.device = device or _default_device()
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        precision_key(precision)
        self.active = self.identity.reports_job or self.identity.reports_host
        """False on ranks that report nothing: every method is then a no-op, and nothing is logged."""
        self.scale = Scale(
            world_size=self.identity.world_size,
            data_parallel_size=data_parallel_size,
            flops_per_step=flops_per_step,
            flops_per_token=flops_per_token,
            peak_tflops=peak_tflops or self._peak_from_table(precision, flops_per_step or flops_per_token),
        )
        self.sinks = build_sinks(sinks if self.active or stall_dumps else [], stacks_only=not self.active)

        self._clock = clock
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._closed = False
        self._close_claim = threading.Lock()
        self._close_done = threading.Event()
        self._started_at = self._clock()
        self._window_start = self._started_at
        self._totals = WindowTotals()
        self._step = 0
        self._ended = 0
        """Steps ended on this rank (every rank): the stall watch's view of the loop."""
        self._last_step_at: float | None = None
        self._step_started_at: float | None = None
        self._open_step_counted_s = 0.0
        self._busy_depth = 0
        self._busy_since = 0.0
        self._phases: list[tuple[str, float, float]] = []
        self._seconds_per_step: float | None = None
        self._losses = LossBuffer()
        self._events = CudaStepEvents(sys.modules["torch"]) if self.device == "cuda" else None
        self._accelerators = _accelerator_sampler() if self.identity.reports_host else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks: StackWatch | None = None
        if stall_dumps is not None and self.sinks.takes_stacks:
            hold = self._phases_end
            self._stacks = StackWatch(
                stall_dumps, self.identity, self.sinks.emit_stacks, self._ended_steps, hold, clock
            )
        self._running = self.active or self._stacks is not None
        """This process has threads and sinks to close (a rank that reports nothing may still watch for stalls)."""
        self._flushes_on_sigterm = False
        if self._running:
            _agents.add(self)
            atexit.register(self.close)
            if handle_sigterm:
                self._flushes_on_sigterm = sigterm.subscribe(self._on_sigterm)
        if self.active:
            self._thread = threading.Thread(target=self._run, name="stallwatch-agent", daemon=True)
            self._thread.start()
        if self._stacks is not None:
            self._stacks.start()

    # -- the loop's API ------------------------------------------------------------------------------------

    @contextmanager
    def step(
        self,
        tokens: int | None = None,
        samples: int | None = None,
        step: int | None = None,
        *,
        job_tokens: int | None = None,
    ) -> Iterator[None]:
        """Time one optimizer step (all its micro-batches). `tokens`/`samples` are this rank's for the step;
        `job_tokens` (instead of `tokens`) is the whole job's, already summed over ranks; `step` sets the
        global step number."""
        self.start_step()
        try:
            yield
        except BaseException:
            self.abort_step()
            raise
        self.end_step(tokens=tokens, samples=samples, step=step, job_tokens=job_tokens)

    @_never_raises
    def start_step(self) -> None:
        """Mark the start of a step (for callbacks that cannot use the step() context manager)."""
        if not self.active or self._closed:
            return
        now = self._clock()
        with self._lock:
            if self._events is not None:
                self._events.start()
                self._open_step_counted_s = 0.0
            elif self._step_started_at is None:
                self._enter_busy(now)
            self._step_started_at = now

    @_never_raises
    def end_step(
        self,
        tokens: int | None = None,
        samples: int | None = None,
        step: int | None = None,
        *,
        job_tokens: int | None = None,
    ) -> None:
        """Mark the end of the step started by start_step() (arguments as for step())."""
        self._ended += 1  # on every rank, the stall watch's only cost to the loop: no call, no lock
        if not self.active or self._closed:
            return
        now = self._clock()
        if job_tokens is None and tokens is not None:
            job_tokens = tokens * self.scale.data_ranks
        job_samples = None if samples is None else samples * self.scale.data_ranks
        with self._lock:
            started = self._step_started_at
            if started is None:
                return
            self._step_started_at = None
            number = step if step is not None else self._step + 1 + self._pending_count()
            totals = self._totals
            totals.counts_tokens |= job_tokens is not None
            totals.counts_samples |= job_samples is not None
            counts = (job_tokens or 0, job_samples or 0)
            if self._events is not None:
                self._events.end(number, now, *counts, counted_s=self._open_step_counted_s)
            else:
                self._leave_busy(now)
                self._complete(CompletedStep(number, now, now - started, *counts))

    @_never_raises
    def abort_step(self) -> None:
        """Forget the open step (its body raised)."""
        if not self.active:
            return
        with self._lock:
            if self._step_started_at is not None:
                self._step_started_at = None
                if self._events is not None:
                    self._events.abort()
                else:
                    self._leave_busy(self._clock())

    @_never_raises
    def record(self, loss: Any = None) -> None:
        """Record a loss: a float or a tensor (detached, read when the window rolls; never synchronizes)."""
        if not self.active or self._closed or loss is None:
            return
        with self._lock:
            self._losses.add(loss)

    @contextmanager
    def phase(self, name: str, budget_s: float) -> Iterator[None]:
        """Declare a phase (checkpoint, eval, ...): PhaseBudgetRemaining stays > 0 while it runs within budget_s."""
        opened = self.start_phase(name, budget_s)
        try:
            yield
        finally:
            if opened:
                self.end_phase()

    @_never_raises
    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Emit the current window now and wait up to timeout_s for the sinks to take it (it restarts the
        window; the background thread keeps its schedule)."""
        if self.active and not self._closed:
            self._emit()
            self.sinks.wait_idle(timeout_s)

    @_never_raises
    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Emit the last (partial) window and close the sinks, returning within timeout_s; while another thread
        closes the agent (SIGTERM), wait for it, as long as timeout_s."""
        if not self._running or os.getpid() != self._pid:
            return
        if not self._close_claim.acquire(blocking=False):
            self._close_done.wait(timeout_s)
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        try:
            self._stop.set()
            if self._stacks is not None:
                self._stacks.stop()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(min(timeout_s / 4, THREAD_JOIN_S))
            if self.active:
                self._emit()
            if self._accelerators is not None:
                self._accelerators.close()
            self.sinks.close(max(deadline - time.monotonic(), 0.0))
        finally:
            atexit.unregister(self.close)
            if self._flushes_on_sigterm:
                sigterm.unsubscribe(self._on_sigterm)
            self._close_done.set()

    def _on_sigterm(self, timeout_s: float) -> None:
        """SIGTERM (on the agent's SIGTERM thread): the stacks first if the loop is blocked, then close()."""
        deadline = time.monotonic() + timeout_s
        if self._stacks is not None:
            self._stacks.on_sigterm(timeout_s / 4)
        self.close(max(deadline - time.monotonic(), 0.0))

    # -- windows -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        next_emit = time.monotonic() + self.interval_s
        sample_every = min(ACCELERATOR_SAMPLE_S, self.interval_s)
        while not self._stop.wait(max(min(next_emit - time.monotonic(), sample_every), 0.0)):
            try:
                if self._accelerators is not None:
                    self._accelerators.sample()
                now = time.monotonic()
                if now >= next_emit:
                    next_emit += self.interval_s
                    if next_emit <= now:  # woke late (suspended host): restart the schedule rather than burst
                        next_emit = now + self.interval_s
                    self._emit()
            except Exception as error:  # keep the heartbeat alive whatever a window does
                warn_once("agent:thread", "trainer_agent: emitting a window failed: %r", error)

    def _emit(self) -> None:
        """Roll the window and hand it to the sinks (on the background thread, or from close())."""
        totals, progress, phase, pending_losses = self._roll()
        try:
            totals.losses += read(pending_losses)
        except Exception as error:  # the window's other metrics still go out
            warn_once("agent:loss", "trainer_agent: a recorded loss could not be read; dropping it: %r", error)
        ident, t = self.identity, time.time()
        windows = []
        if ident.reports_job:
            metrics = job_metrics(totals, progress, self.scale)
            metrics = with_old_names(metrics) if self.device == "cuda" else metrics
            windows.append(Window(SCOPE_JOB, t, ident.job, ident.host, ident.rank, self.interval_s, metrics, phase))
        if ident.reports_host:
            sampler = self._accelerators
            metrics = host_metrics(totals, sampler.take() if sampler is not None else None)
            metrics = with_old_names(metrics) if sampler is not None and sampler.gpus else metrics
            windows.append(Window(SCOPE_HOST, t, ident.job, ident.host, ident.rank, self.interval_s, metrics, phase))
        for window in windows:
            self.sinks.emit(window)

    def _roll(self) -> tuple[WindowTotals, Progress, str | None, list[Any]]:
        with self._lock:
            now = self._clock()
            if self._events is not None:
                for completed in self._events.completed():
                    self._complete(completed)
            if self._busy_depth:
                self._totals.busy_s += now - self._busy_since
                self._busy_since = now
            if self._events is not None and self._step_started_at is not None:
                # A device step still open (perhaps hung) is busy time; its device duration later counts the rest.
                open_s = now - max(self._step_started_at, self._window_start)
                self._totals.busy_s += open_s
                self._open_step_counted_s += open_s
            totals, self._totals = self._totals, WindowTotals()
            self._totals.counts_tokens, self._totals.counts_samples = totals.counts_tokens, totals.counts_samples
            totals.wall_s = now - self._window_start
            self._window_start = now
            floats, tensors = self._losses.take()
            totals.losses = floats
            if totals.steps:
                self._seconds_per_step = totals.wall_s / totals.steps
            progress = Progress(
                step=self._step,
                last_step_age_s=now - (self._last_step_at or self._started_at),
                phase_budget_remaining_s=min((start + budget - now for _, start, budget in self._phases), default=0.0),
                eta_s=self._eta(),
            )
            phase = self._phases[-1][0] if self._phases else None
        return totals, progress, phase, tensors

    def _complete(self, completed: CompletedStep) -> None:
        totals = self._totals
        totals.steps += 1
        totals.tokens += completed.tokens
        totals.samples += completed.samples
        totals.busy_s += completed.busy_s
        if completed.duration_s is not None:
            totals.step_seconds += completed.duration_s
            totals.timed_steps += 1
        self._step = completed.step
        self._last_step_at = completed.ended_at

    def _eta(self) -> float | None:
        if self.total_steps is None or self._seconds_per_step is None:
            return None
        return max(self.total_steps - self._step, 0) * self._seconds_per_step

    def _pending_count(self) -> int:
        return self._events.pending if self._events is not None else 0

    # -- phases and busy time ------------------------------------------------------------------------------

    @_never_raises
    def start_phase(self, name: str, budget_s: float) -> bool:
        """Open a phase (for callbacks that cannot use the phase() context manager); False if ignored. Every rank
        keeps its phases: the stall watch writes no stacks while one is within its budget."""
        if not self._running or self._closed:
            return False
        if not budget_s > 0:
            if self.active:
                warn_once(
                    f"phase-budget:{name}", "phase %r: budget_s must be > 0, not %r; phase ignored", name, budget_s
                )
            return False
        now = self._clock()
        with self._lock:
            self._enter_busy(now)
            self._phases.append((name, now, float(budget_s)))
        return True

    @_never_raises
    def end_phase(self) -> None:
        """Close the innermost open phase."""
        with self._lock:
            if self._phases:
                self._phases.pop()
                self._leave_busy(self._clock())

    def _phases_end(self) -> float | None:
        """When the open phases' budgets are spent (the agent's clock), or None without one."""
        return max((start + budget for _, start, budget in list(self._phases)), default=None)

    def _ended_steps(self) -> int:
        return self._ended

    def _enter_busy(self, now: float) -> None:
        if self._busy_depth == 0:
            self._busy_since = now
        self._busy_depth += 1

    def _leave_busy(self, now: float) -> None:
        self._busy_depth -= 1
        if self._busy_depth == 0:
            self._totals.busy_s += now - self._busy_since

    # -- peak FLOPs, fork -------------------------------------------------------------------------

    def _peak_from_table(self, precision: object, flops: float | None) -> float | None:
        if flops is None or not self.active:
            return None
        name = _device_name(self.device)
        peak = table_peak_tflops(name, precision)
        if peak is None:
            logger.warning(
                "no peak FLOPs known for device %r at %s; MFU is not reported (pass peak_tflops= to set it)",
                name,
                precision,
            )
        return peak

    def _after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) is not the reporting process: it stays silent."""
        self.active = False
        self._running = False
        self._stacks = None
        self._lock = threading.RLock()


def _forked_child() -> None:
    for agent in list(_agents):
        agent._after_fork_in_child()


os.register_at_fork(after_in_child=_forked_child)


def _default_device() -> str:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return "cuda"
    return "xla" if sys.modules.get("torch_xla") is not None else "cpu"


def _device_name(device: str) -> str:
    """The device as trainer_agent.peaks looks it up: CUDA's name for the GPU, on XLA the Neuron driver's NeuronCore."""
    if device == "cuda":
        torch = sys.modules["torch"]
        return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    if device == "xla":
        return neuron.core_name() or device
    return device


def _accelerator_sampler() -> GpuSampler | NeuronSampler:
    """The host's accelerators' sampler: neuron-monitor's on a host with Neuron devices, else NVML's."""
    return NeuronSampler() if neuron.present() else GpuSampler()
