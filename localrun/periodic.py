"""A background thread that calls a function every few seconds until stopped, reporting (not dying of) errors.

ticker = Periodic("host-metrics", 2.0, publish, on_error=print).start()
ticker.stop()
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Periodic:
    """Calls `tick` every `interval_s` on its own thread; an exception goes to `on_error` and the loop goes on."""

    def __init__(
        self, name: str, interval_s: float, tick: Callable[[], None], on_error: Callable[[str, BaseException], None]
    ) -> None:
        self.name = name
        self._interval_s = interval_s
        self._tick = tick
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Periodic:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._tick()
            except Exception as exc:  # a failing tick must not end the run's plumbing
                self._on_error(self.name, exc)

    def stop(self) -> None:
        """Stop and wait for the current tick to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
