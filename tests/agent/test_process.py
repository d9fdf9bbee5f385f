"""The agent in real processes: SIGTERM flush, crash, hang, checkpoint and idle faults, and forked workers."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from trainer_agent import TrainerAgent

ROOT = Path(__file__).resolve().parents[2]
TRAIN_GPT = ROOT / "examples" / "train_gpt.py"
WAIT_S = 90.0


class Training:
    """examples/train_gpt.py as a subprocess, its stdout read on a thread so waits are bounded."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.jsonl = tmp_path / "windows.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
        env |= {"PYTHONPATH": str(ROOT), "STALLWATCH_JOB_NAME": "demo-job", "SM_CURRENT_HOST": "algo-1"}
        env.pop("AWS_SESSION_TOKEN", None)
        env.pop("AWS_SECURITY_TOKEN", None)
        command = [sys.executable, str(TRAIN_GPT), "--jsonl", str(self.jsonl), *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for_line(self, prefix: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                continue
            self.stdout.append(line)
            if line.startswith(prefix):
                return
        raise AssertionError(f"no line starting {prefix!r} within {WAIT_S} s; got {self.stdout[-5:]}")

    def windows(self, scope: str = "job") -> list[dict]:
        if not self.jsonl.exists():
            return []
        complete = self.jsonl.read_text().split("\n")[:-1]  # a line still being written has no newline yet
        records = [json.loads(line) for line in complete if line.strip()]
        return [record for record in records if record["scope"] == scope]

    def wait_for_windows(self, condition) -> list[dict]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if condition(windows := self.windows()):
                return windows
            time.sleep(0.2)
        raise AssertionError(f"windows never matched: {self.windows()[-3:]}")

    def stop(self) -> tuple[int, str]:
        """SIGTERM, as SageMaker's StopTrainingJob sends; returns the exit code and stderr."""
        self.process.send_signal(signal.SIGTERM)
        return self.finish()

    def finish(self) -> tuple[int, str]:
        code = self.process.wait(WAIT_S)
        return code, self.process.stderr.read()


@pytest.mark.slow
def test_sigterm_flushes_the_last_window_and_exits_zero(tmp_path):
    # Given training that runs until stopped, with a window far longer than the run
    training = Training(tmp_path, "--steps", "0", "--interval", "3600")
    training.wait_for_line("step 3 ")

    # When SageMaker stops the job
    code, stderr = training.stop()

    # Then the process exits 0 after writing the final window, with the steps it made
    assert code == 0, stderr
    (window,) = training.windows()
    assert window["Step"] >= 3
    assert window["job"] == "demo-job"
    assert training.windows("host")[0]["host"] == "algo-1"


SIGTERM_SCRIPT = """
import os, signal, sys, time
from trainer_agent import TrainerAgent, sigterm
from trainer_agent.sinks import JsonlSink
previous = sys.argv[2]
if previous == "ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if previous == "python":
    def stop(signum, frame):
        print("previous handler ran", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
agent = TrainerAgent(job_name="j", interval_s=3600, sinks=[JsonlSink(sys.argv[1])])
if previous == "foreign":
    sigterm._relay.previous = None  # what signal.getsignal returns for a handler installed outside Python
if previous == "fork":
    pid = os.fork()
    if pid == 0:  # a DataLoader-like child: SIGTERM's own default applies, and the parent hears nothing
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(3)
    print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
with agent.step():
    pass
print("ready", flush=True)
time.sleep(2 if previous == "ignored" else 60)
print("still running", flush=True)
agent.close()
"""


def run_sigterm_script(tmp_path: Path, previous: str) -> tuple[int, list[str], list[dict]]:
    """Start SIGTERM_SCRIPT with the given previous disposition, SIGTERM it once ready; exit code, stdout, windows."""
    jsonl = tmp_path / "windows.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT, str(jsonl), previous],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = []
    while (line := process.stdout.readline().strip()) != "ready":
        assert line, "the script ended before it was ready"
        lines.append(line)
    process.send_signal(signal.SIGTERM)
    code = process.wait(WAIT_S)
    lines += process.stdout.read().splitlines()
    records = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    return code, lines, [record for record in records if record["scope"] == "job"]


@pytest.mark.parametrize(
    ("previous", "exit_code", "printed"),
    [
        ("default", -signal.SIGTERM, []),
        ("foreign", -signal.SIGTERM, []),
        ("python", 0, ["previous handler ran"]),
        ("fork", -signal.SIGTERM, ["child -15"]),
    ],
)
def test_sigterm_flushes_the_last_window_then_the_previous_disposition_applies(tmp_path, previous, exit_code, printed):
    # Given an agent installed over SIGTERM's default, a handler installed outside Python, a Python
    # handler, or with a forked child that SIGTERMs itself first

    # When SIGTERM arrives
    code, lines, windows = run_sigterm_script(tmp_path, previous)

    # Then the last window is flushed, and the process ends as the previous disposition says (a child
    # forked from it was killed by its own SIGTERM without waking the parent's handling)
    assert [window["Step"] for window in windows] == [1]
    assert code == exit_code
    assert lines == printed


def test_an_ignored_sigterm_stays_ignored_and_the_agent_keeps_reporting(tmp_path):
    code, lines, windows = run_sigterm_script(tmp_path, "ignored")
    assert (code, lines) == (0, ["still running"])
    assert [window["Step"] for window in windows] == [1]  # from close(), not from the signal


SIGTERM_INSIDE_THE_AGENT = """
import os, signal, sys, time, types
from trainer_agent import TrainerAgent
from trainer_agent.sinks import JsonlSink

class Event:  # a CUDA event on a fake device that finishes at once; SIGTERM arrives inside the agent's lock
    def __init__(self, enable_timing=False):
        pass
    def record(self):
        if armed:
            os.kill(os.getpid(), signal.SIGTERM)
    def query(self):
        return True
    def elapsed_time(self, end):
        return 10.0

cuda = types.SimpleNamespace(Event=Event, is_available=lambda: True)
sys.modules["torch"] = types.SimpleNamespace(cuda=cuda, distributed=types.SimpleNamespace(is_available=lambda: False))
armed = False
agent = TrainerAgent(job_name="j", interval_s=3600, device="cuda", sinks=[JsonlSink(sys.argv[1])])
with agent.step():
    armed = True
time.sleep(60)
"""


def test_sigterm_arriving_while_the_loop_holds_the_agents_lock_still_flushes_and_terminates(tmp_path):
    # Given SIGTERM delivered while the main thread is inside end_step(), holding the agent's lock
    jsonl = tmp_path / "windows.jsonl"
    process = subprocess.run(
        [sys.executable, "-c", SIGTERM_INSIDE_THE_AGENT, str(jsonl)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=WAIT_S,
    )

    # Then the handler did not wait on the watcher (which needs that lock): the step's window went out and
    # the process ended by SIGTERM
    assert process.returncode == -signal.SIGTERM
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["Steps"], r["Step"]) for r in records if r["scope"] == "job"] == [(1, 1)]


def test_closing_the_last_agent_puts_the_previous_handler_and_wakeup_fd_back(sink):
    # Given SIGTERM's default and no wakeup fd, then an agent handling SIGTERM
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    agent = TrainerAgent(interval_s=3600.0, sinks=[sink])
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL

    # When it closes
    agent.close()

    # Then both are as they were
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.slow
def test_a_crash_prints_the_nccl_error_and_traceback_exits_non_zero_and_flushes(tmp_path):
    training = Training(tmp_path, "--steps", "0", "--interval", "3600", "--fault", "crash", "--fault-after", "2")
    code, stderr = training.finish()
    assert code != 0
    assert "Traceback (most recent call last)" in stderr
    assert "NCCL error" in stderr
    assert "an illegal memory access was encountered" in stderr
    assert training.windows()[-1]["Step"] == 2


@pytest.mark.slow
def test_a_hang_keeps_emitting_zero_step_windows_while_the_watchdog_logs(tmp_path):
    # Given training that hangs inside step 3
    training = Training(tmp_path, "--steps", "0", "--interval", "1", "--fault", "hang", "--fault-after", "2")

    # When windows pass (after the steps before the hang: a loaded machine may take seconds to reach them)
    windows = training.wait_for_windows(
        lambda ws: any(w["Step"] >= 2 and w["Steps"] == 0 and w["LastStepAge"] > 6 for w in ws)
    )
    code, stderr = training.stop()

    # Then the job shows no progress, time spent inside the step (not waiting for data), and NCCL-like log lines
    stuck = windows[-1]
    assert (stuck["Steps"], stuck["Step"]) == (0, 2)
    assert stuck["DataWaitFraction"] < 50
    assert code == 0
    assert "Watchdog: still waiting for collective ALLREDUCE" in stderr


@pytest.mark.slow
def test_a_checkpoint_phase_reports_its_budget_then_training_resumes(tmp_path):
    training = Training(
        tmp_path,
        *("--steps", "6", "--interval", "1", "--fault", "checkpoint", "--fault-after", "3"),
        *("--checkpoint-budget", "30", "--checkpoint-seconds", "2.5"),
    )
    code, stderr = training.finish()
    assert code == 0, stderr
    windows = training.windows()
    in_phase = [w for w in windows if w["phase"] == "checkpoint"]
    assert in_phase
    assert all(0 < w["PhaseBudgetRemaining"] <= 30 for w in in_phase)
    assert windows[-1]["Step"] == 6


@pytest.mark.slow
def test_idle_stops_all_output_but_the_agent_keeps_publishing(tmp_path):
    training = Training(tmp_path, "--steps", "0", "--interval", "1", "--fault", "idle", "--fault-after", "2")
    training.wait_for_line("fault idle")
    training.wait_for_windows(lambda ws: sum(1 for w in ws if w["Steps"] == 0 and w["Step"] == 2) >= 2)
    code, stderr = training.stop()
    assert code == 0, stderr
    assert training.lines.empty()
    assert training.windows()[-1]["DataWaitFraction"] > 50


class PidSink:
    """Appends the emitting process's pid to a file per window (it survives fork, unlike an in-memory list)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def emit(self, window) -> None:
        with self.path.open("a") as file:
            file.write(f"{os.getpid()} {window.scope} {window.metrics.get('Steps')}\n")

    def close(self, timeout_s: float) -> None:
        pass

    def pids(self) -> set[int]:
        return {int(line.split()[0]) for line in self.path.read_text().splitlines()}


def test_a_forked_child_is_silent_and_the_parent_keeps_reporting(tmp_path):
    sink = PidSink(tmp_path / "pids")
    agent = TrainerAgent(interval_s=3600.0, sinks=[sink], handle_sigterm=False)
    pid = os.fork()
    if pid == 0:  # the child uses the inherited agent as a worker might, then exits without flushing anything
        with agent.step():
            agent.record(loss=1.0)
        agent.flush()
        agent.close()
        os._exit(0 if not agent.active else 3)
    _, status = os.waitpid(pid, 0)
    with agent.step():
        pass
    agent.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert sink.pids() == {os.getpid()}


class Batches(Dataset):
    """A dataset whose workers touch the agent (as a careless user's code might)."""

    def __init__(self, agent: TrainerAgent) -> None:
        self.agent = agent

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        self.agent.record(loss=float(index))
        self.agent.flush()
        return torch.full((4,), float(index))


def test_dataloader_fork_workers_do_not_disturb_the_agent(tmp_path):
    sink = PidSink(tmp_path / "pids")
    agent = TrainerAgent(interval_s=3600.0, sinks=[sink], handle_sigterm=False)
    loader = DataLoader(Batches(agent), batch_size=4, num_workers=2, multiprocessing_context="fork")
    for batch in loader:
        with agent.step(samples=len(batch)):
            batch.sum()
    agent.close()
    assert sink.pids() == {os.getpid()}
    steps = [line.split()[2] for line in (tmp_path / "pids").read_text().splitlines() if " job " in line]
    assert steps == ["4.0"]


def test_the_agent_needs_no_third_party_package():
    # Given a Python where torch, boto3 and pynvml cannot be imported
    script = """
import sys
for name in ("torch", "boto3", "botocore", "pynvml"):
    sys.modules[name] = None
from trainer_agent import TrainerAgent
agent = TrainerAgent(interval_s=3600, flops_per_step=1e9, peak_tflops=10.0)
with agent.step(tokens=10, samples=1):
    pass
agent.record(loss=2.5)
agent.close()
"""
    # When an agent runs a step there with the default sinks
    env = os.environ | {"PYTHONPATH": str(ROOT), "STALLWATCH_JOB_NAME": "bare-python"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=WAIT_S)

    # Then it printed its windows on stdout and nothing failed
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout.splitlines()[0])
    assert (job["JobName"], job["Steps"], job["Loss"]) == ("bare-python", 1.0, 2.5)
    assert result.stderr == ""


def test_an_agent_without_a_wakeup_pipe_still_runs_and_says_why(monkeypatch, sink, caplog):
    # Given a platform where the wakeup pipe cannot be made
    def no_pipe():
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "pipe", no_pipe)

    # When an agent that handles SIGTERM starts
    with caplog.at_level(logging.WARNING, logger="trainer_agent"):
        agent = TrainerAgent(interval_s=3600.0, sinks=[sink])
    with agent.step():
        pass
    agent.close()

    # Then it reported as usual, left SIGTERM alone, and said why once
    assert sink.job[-1].metrics["Step"] == 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert [r.getMessage() for r in caplog.records] == [
        "SIGTERM will not flush the last window: OSError(24, 'Too many open files')"
    ]
