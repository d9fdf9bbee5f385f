"""The agent's logger, and a warning that is logged once per cause (a failing sink must not flood the log).

warn_once("sink:JsonlSink", "JsonlSink failed: %s", error)
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("trainer_agent")

_seen: set[str] = set()
_seen_lock = threading.RLock()  # re-entrant: the SIGTERM handler may log while its thread holds it


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process."""
    with _seen_lock:
        if key in _seen:
            return
        _seen.add(key)
    logger.warning(message, *args)
