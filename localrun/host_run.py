"""One training host of the job: its training process, its log stream and its platform host metrics.

The process's output goes to the host's CloudWatch Logs stream; the agent's EMF line feeds the terminal view, and its
stack dump the timeline; the training script's fault markers tell the host-metric simulator what the GPUs would be
doing.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localrun import request_log
from localrun.host_metrics import HostMetricsSimulator
from localrun.log_shipper import LogShipper
from localrun.periodic import Periodic
from localrun.scenarios import FAULT_ACTIVITY, HOST_METRICS_INTERVAL_S, TRAINING_THREADS, HostActivity
from localrun.timeline import Kind, Progress, Timeline
from localrun.training import TrainingProcess
from stallwatch.core import stack_dumps
from stallwatch.core.contract import STACKS_MARKER
from stallwatch.core.signals import LogLine, Platform

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = REPO_ROOT / "examples" / "train_gpt.py"
FAULT_MARKER = "fault "  # examples/train_gpt.py prints "fault <kind> at step <n>" when it injects the fault
FAULT_OVER_MARKER = "checkpoint saved"  # ...and this when a checkpoint phase is over
RESUMED_MARKER = "resumed from checkpoint"  # ...and this when it goes on from a checkpoint it found
EMF_SCOPE_JOB = "job"
# Environment a training process must not inherit from the demo (the demo's own AWS setup is passed explicitly).
_DROPPED_ENV = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "TRAINING_JOB_NAME", "STALLWATCH_JOB_NAME", "SM_CURRENT_HOST")


def parse_progress(t: float, line: str) -> Progress | None:
    """The agent's job-scope EMF line as progress; None for any other line."""
    if not line.startswith("{") or '"_aws"' not in line:
        return None
    try:
        document: dict[str, Any] = json.loads(line)
    except ValueError:
        return None
    if document.get("Scope") != EMF_SCOPE_JOB:
        return None

    def number(name: str) -> float | None:
        value = document.get(name)
        return float(value) if isinstance(value, int | float) else None

    step = number("Step")
    return Progress(
        t=t,
        step=None if step is None else int(step),
        tflops_per_gpu=number("TFLOPsPerAccelerator"),
        mfu=number("MFU"),
        loss=number("Loss"),
        last_step_age=number("LastStepAge"),
        phase_budget_remaining=number("PhaseBudgetRemaining"),
    )


class HostRun:
    """algo-N or an instance: a real training process, shipped logs and simulated platform metrics."""

    def __init__(
        self,
        *,
        job: str,
        host: str,
        rank: int,
        world_size: int,
        fault: str,
        train_args: list[str],
        aws_env: dict[str, str],
        clients: dict[str, Any],
        log_place: tuple[str, str],
        platform_env: dict[str, str],
        platform: Platform,
        timeline: Timeline,
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self.host = host
        self.rank = rank
        self._fault = fault
        self._timeline = timeline
        self.fault_started = False
        self.fault_over = False
        self.exit_code: int | None = None
        self.shipper = LogShipper(clients["logs"], *log_place, on_error)
        self.simulator = HostMetricsSimulator(
            clients["cloudwatch"], job, host, self.activity, seed=rank, platform=platform
        )
        self._metrics = Periodic(f"host-metrics:{host}", HOST_METRICS_INTERVAL_S, self._publish, on_error)
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV} | aws_env
        env |= platform_env | {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": "0",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
            "OMP_NUM_THREADS": str(TRAINING_THREADS),
            "MKL_NUM_THREADS": str(TRAINING_THREADS),
        }
        self._env = request_log.child_env(env)
        self.process = TrainingProcess(
            [sys.executable, str(TRAIN_SCRIPT), *train_args], self._env, on_line=self._on_line
        )

    def activity(self) -> HostActivity:
        """What the host's GPUs are doing now, as far as SageMaker's metrics would tell."""
        if self.exit_code is not None:
            return HostActivity.EXITED
        if self.fault_started and not self.fault_over:
            return FAULT_ACTIVITY[self._fault]
        return HostActivity.TRAINING

    def start(self) -> HostRun:
        self.shipper.start()
        self.process.start()
        self._metrics.start()
        self._timeline.event(Kind.TRAIN, f"{self.host}: training started (pid {self.process.pid})")
        return self

    def restart(self, train_args: list[str], grace_s: float) -> None:
        """What `systemctl restart` does to the launcher's unit: its processes stopped (SIGTERM, then SIGKILL after
        `grace_s`), then the training started again with `train_args` (from its checkpoint)."""
        self.process.kill_group(grace_s=grace_s)
        self.check_exit()
        self.exit_code, self.fault_started, self.fault_over, self._fault = None, False, False, "none"
        argv = [sys.executable, str(TRAIN_SCRIPT), *train_args]
        self.process = TrainingProcess(argv, self._env, on_line=self._on_line).start()
        self._timeline.event(Kind.TRAIN, f"{self.host}: training restarted in place (pid {self.process.pid})")

    def _publish(self) -> None:
        self.simulator.publish()
        if self.rank == 0:
            self._timeline.set_gpu_util(self.simulator.last_gpu_per_device)

    def _on_line(self, t: float, line: str) -> None:
        self.shipper.add(t, line)
        progress = parse_progress(t, line)
        if progress is not None:
            self._timeline.set_progress(progress)
        elif line.startswith(FAULT_MARKER):
            self.fault_started = True
            self._timeline.mark_fault_onset(t)
            self._timeline.event(Kind.FAULT, f"{self.host}: {line}")
        elif STACKS_MARKER in line and (dump := stack_dumps.parse(LogLine(t, self.host, line))) is not None:
            self._timeline.event(Kind.STACKS, f"{self.host}: {dump.describe()}")
        elif line.startswith(RESUMED_MARKER):
            self._timeline.event(Kind.TRAIN, f"{self.host}: {line}")
        elif line.startswith(FAULT_OVER_MARKER):
            self.fault_over = True
            self._timeline.event(Kind.TRAIN, f"{self.host}: {line}; training resumes")

    def check_exit(self) -> int | None:
        """The exit code, recorded (with a timeline event) the first time the process is seen to have exited."""
        if self.exit_code is None:
            code = self.process.poll()
            if code is not None:
                self.exit_code = code
                self._timeline.event(Kind.TRAIN, f"{self.host}: training process exited with code {code}")
        return self.exit_code

    def stop(self) -> None:
        """Kill what is left of the process group, then stop publishing and flush the logs."""
        self.process.kill_group()
        self.check_exit()
        self._metrics.stop()
        self.shipper.stop()
