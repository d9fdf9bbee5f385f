"""The agent's logger, and a warning that is logged once per cause (a failing sink must not flood the log).

warn_once("cloudwatch-client", "CloudWatch sink is off: %r", error)
warn_once(self._failed_key, "sink %s failed: %r", sink, error)   # self._failed_key = cause_key("emit"), taken once
"""

from __future__ import annotations

import itertools
import logging
import threading

logger = logging.getLogger("trainer_agent")

_seen: set[str] = set()
_seen_lock = threading.RLock()  # re-entrant: the SIGTERM handler may log while its thread holds it
_serials = itertools.count()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process."""
    with _seen_lock:
        if key in _seen:
            return
        _seen.add(key)
    logger.warning(message, *args)


def cause_key(cause: str) -> str:
    """A `warn_once` key for one object's `cause` ("emit", "behind"), taken when the object is made: a serial, never
    reused (an `id()` is, once its object is gone, and a later object's failure would go unlogged)."""
    return f"{cause}:{next(_serials)}"
