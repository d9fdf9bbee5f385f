"""A small moto extension: requests handled one at a time, as each AWS service handles concurrent callers safely.

    from localrun import moto_threads
    moto_threads.install()

moto's backends are plain Python objects: two threads writing one DynamoDB table at once can fail inside moto
("dictionary changed size during iteration" in TransactWriteItems), which AWS never does. The sweeper decides due
jobs on 16 threads, so tests, the bench and the demo serialize moto's request handling; the callers' own work
(and any latency a bench adds before a call) still overlaps.
"""

from __future__ import annotations

import threading
from typing import Any

from moto.core.responses import BaseResponse

_lock = threading.RLock()  # re-entrant: a moto request may call another service's
_original: Any = None


def _serialized(cls: type[BaseResponse], *args: Any, **kwargs: Any) -> Any:
    with _lock:
        return _original(cls, *args, **kwargs)


def install() -> None:
    global _original
    if _original is None:
        _original = BaseResponse.dispatch.__func__  # type: ignore[attr-defined]
        BaseResponse.dispatch = classmethod(_serialized)  # type: ignore[method-assign,assignment]
