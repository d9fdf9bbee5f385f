"""The training subprocess: started in its own process group, its output read line by line, stopped like SageMaker.

process = TrainingProcess([sys.executable, "examples/train_gpt.py"], env, on_line=print).start()
process.sigterm()          # what StopTrainingJob does to the container
process.kill_group()       # cleanup: nothing of it survives
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

KILL_WAIT_S = 5.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it if the demo itself dies without cleaning up (kill -9)."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class TrainingProcess:
    """A child process whose merged stdout/stderr goes to `on_line`, one line (without newline) at a time."""

    def __init__(self, argv: list[str], env: dict[str, str], on_line: Callable[[float, str], None]) -> None:
        self._argv = argv
        self._env = env
        self._on_line = on_line
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> TrainingProcess:
        # A new session: Ctrl-C on the terminal reaches only the demo, which then stops the child in order.
        # The death signal covers the one case no cleanup can: the demo killed with SIGKILL. Only an
        # async-signal-safe prctl call runs in the child before exec, so the preexec hook is safe with threads.
        self._process = subprocess.Popen(
            self._argv,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._reader = threading.Thread(target=self._read, name="training-stdout", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._on_line(time.time(), line.rstrip("\n"))

    def poll(self) -> int | None:
        """The exit code once the process has exited, else None."""
        return self._process.poll() if self._process is not None else None

    def sigterm(self) -> None:
        """Send SIGTERM to the training process, as SageMaker does on StopTrainingJob."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        """Wait up to `timeout` seconds; the exit code, or None if it still runs."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self, grace_s: float = KILL_WAIT_S) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after `grace_s`, and reap."""
        if self._process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
            if not _group_alive(self._process.pid):
                break
            try:
                os.killpg(self._process.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while _group_alive(self._process.pid) and time.monotonic() < deadline:
                self._process.poll()
                time.sleep(0.05)
        self._process.poll()
        if self._reader is not None:
            self._reader.join(timeout=KILL_WAIT_S)
        if self._process.stdout is not None:
            self._process.stdout.close()


def _group_alive(pgid: int) -> bool:
    """True while any process of the group exists (a zombie leader counts until it is reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
