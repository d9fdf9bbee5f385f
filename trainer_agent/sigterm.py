"""SIGTERM flushes the last window at once, even while the main thread is blocked in C (a hung collective).

    if sigterm.subscribe(agent.close):     # from the main thread; agent.close(timeout_s) runs on SIGTERM
        ...
    sigterm.unsubscribe(agent.close)

CPython runs a Python signal handler only when the main thread is between bytecodes, so a handler alone
waits as long as a blocked all_reduce or recv does (and the job dies by SIGKILL, its last window lost).
Here the C-level handler's wakeup byte (`signal.set_wakeup_fd`) wakes a watcher thread that flushes
right away, for at most FLUSH_S; then the previous disposition applies:
- default (or a handler installed outside Python): the process ends by SIGTERM's default action, from
  the watcher, without waiting for the main thread;
- a Python handler: it runs on the main thread, when Python runs handlers, after the flush;
- ignored: nothing is installed, and SIGTERM stays ignored.
A forked child (a DataLoader worker) gets the previous disposition back and never wakes the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from trainer_agent.log import logger

FLUSH_S = 2.0
"""On SIGTERM the subscribers get this long, in all, to flush (the rest of the stop budget is the job's)."""
HANDLER_MARGIN_S = 0.5
"""The main thread's handler waits this much longer than FLUSH_S for the watcher to finish."""
REQUEST = b"\xff"
"""Written by the Python handler to wake the watcher (signal numbers are below 0xff)."""
READ_BYTES = 512
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

Flush = Callable[[float], None]


class _Relay:
    """The process's SIGTERM handler, wakeup pipe and watcher thread; one per process at a time."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.previous: Any = signal.getsignal(signal.SIGTERM)
        self.flushes: list[Flush] = []
        self.spent = False
        """A SIGTERM was handled: the subscribers were flushed (closed)."""
        self._claim = threading.Lock()
        self._flushed = threading.Event()
        self._stopping = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._thread = threading.Thread(target=self._watch, name="stallwatch-sigterm", daemon=True)
        self._thread.start()

    def uninstall(self) -> None:
        """Put back the previous handler and wakeup fd (each only if still ours); stop the watcher."""
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_disposition())
        current = signal.set_wakeup_fd(self._previous_wakeup_fd)
        if current != self._write_fd:  # someone replaced ours since: leave theirs
            signal.set_wakeup_fd(current)
        self._stopping = True
        self._wake()

    def after_fork_in_child(self) -> None:
        """A forked child behaves as without the agent, and its signals never reach the parent's watcher."""
        try:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._previous_disposition())
        except ValueError:  # forked from a thread Python does not see as main: nothing can be reset
            pass
        for fd in (self._read_fd, self._write_fd):
            os.close(fd)

    # -- on SIGTERM ----------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Run every subscriber's flush once, within FLUSH_S in all; later calls return at once."""
        if not self._claim.acquire(blocking=False):
            return
        self.spent = True
        deadline = time.monotonic() + FLUSH_S
        for flush in list(self.flushes):
            try:
                flush(max(deadline - time.monotonic(), 0.0))
            except Exception as error:  # one agent's failure must not cost the others their window
                logger.warning("flushing on SIGTERM failed: %r", error)
        self._flushed.set()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, READ_BYTES)
            except OSError:
                return
            if self._stopping or not data:
                os.close(self._read_fd)
                os.close(self._write_fd)
                return
            self._forward(data.replace(REQUEST, b""))
            if os.getpid() == self.pid and (signal.SIGTERM in data or REQUEST in data):
                self.flush()
                if self._terminates() and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    terminate()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """The Python-level handler (main thread): wait for the watcher's flush, then the previous disposition."""
        if os.getpid() != self.pid or (self.spent and self._flushed.is_set()):
            self._apply_previous(signum, frame)
            return
        if not self._thread.is_alive():
            self.flush()
        self._wake(REQUEST)
        interrupted = None
        if not _inside_agent(frame):
            interrupted = self._await_flush()
        elif self._terminates():  # it may hold a lock the flush needs: carry on; the watcher flushes, then ends it
            return
        self._apply_previous(signum, frame)
        if interrupted is not None:
            raise interrupted

    def _await_flush(self) -> Exception | None:
        """Wait for the watcher's flush, as long as it may take; what another handler raised meanwhile is returned."""
        deadline = time.monotonic() + FLUSH_S + HANDLER_MARGIN_S
        interrupted: Exception | None = None
        while not self._flushed.is_set() and (remaining := deadline - time.monotonic()) > 0:
            try:
                self._flushed.wait(remaining)
            except Exception as error:  # torch's SIGCHLD handler raises when DataLoader workers die
                interrupted = interrupted or error
        return interrupted

    def _apply_previous(self, signum: int, frame: FrameType | None) -> None:
        if callable(self.previous):
            self.previous(signum, frame)
        elif self._terminates():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _terminates(self) -> bool:
        # None: a handler installed outside Python, which Python cannot call; terminating is the safe default.
        return self.previous in (signal.SIG_DFL, None)

    def _previous_disposition(self) -> Any:
        return signal.SIG_DFL if self.previous is None else self.previous

    def _forward(self, data: bytes) -> None:
        """Pass wakeup bytes on to the wakeup fd we replaced (an asyncio loop's), as it would have had them."""
        if data and self._previous_wakeup_fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._previous_wakeup_fd, data)

    def _wake(self, data: bytes = b"\0") -> None:
        with contextlib.suppress(OSError):  # a full pipe: the watcher has bytes to read anyway
            os.write(self._write_fd, data)


def _inside_agent(frame: FrameType | None) -> bool:
    """Whether the interrupted main thread is running agent code."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE_DIR):
            return True
        frame = frame.f_back
    return False


_relay: _Relay | None = None
_lock = threading.Lock()


def subscribe(flush: Flush) -> bool:
    """Call flush(timeout_s) on SIGTERM; False when that cannot be arranged (not the main thread, SIGTERM ignored)."""
    global _relay
    if threading.current_thread() is not threading.main_thread():
        logger.info("not in the main thread; SIGTERM will not flush the last window")
        return False
    with _lock:
        if _relay is not None and _relay.spent:
            _relay.uninstall()
            _relay = None
        if _relay is None:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
                logger.info("SIGTERM is ignored in this process; it will not flush the last window")
                return False
            try:
                _relay = _Relay()
            except (OSError, ValueError) as error:  # no pipe or wakeup fd here: training goes on without it
                logger.warning("SIGTERM will not flush the last window: %r", error)
                return False
        _relay.flushes.append(flush)
    return True


def unsubscribe(flush: Flush) -> None:
    """Stop calling flush; the last subscriber leaving (on the main thread) puts the previous handler back."""
    global _relay
    with _lock:
        if _relay is None or flush not in _relay.flushes:
            return
        _relay.flushes.remove(flush)
        if not _relay.flushes and not _relay.spent and threading.current_thread() is threading.main_thread():
            _relay.uninstall()
            _relay = None


def terminate() -> None:
    """End the process by SIGTERM's default action, from any thread (`signal.signal` is main-thread only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signal.SIGTERM, None)  # SIG_DFL is the null handler
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(FLUSH_S)  # delivery is immediate; this only keeps the thread from carrying on meanwhile
    finally:
        os._exit(128 + signal.SIGTERM)


def _after_fork_in_child() -> None:
    global _relay, _lock
    _lock = threading.Lock()
    if _relay is not None:
        _relay.after_fork_in_child()
        _relay = None


os.register_at_fork(after_in_child=_after_fork_in_child)
