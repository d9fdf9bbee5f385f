"""Fatal-error patterns in training logs: the one table both signal sources match lines against.

    match("RuntimeError: CUDA error: an illegal memory access was encountered")  # "illegal_memory_access"
    match("step 120 loss 2.31")  # None

The first pattern that matches names the line, so the specific ones come before the general ones.
"""

from __future__ import annotations

import re

NCCL_TIMEOUT = "nccl_timeout"
ILLEGAL_MEMORY_ACCESS = "illegal_memory_access"
CUDA_OOM = "cuda_oom"
CUDA_ERROR = "cuda_error"
XID = "xid"
KILLED = "killed"
TRACEBACK = "traceback"

# (name, regex), most specific first.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        ILLEGAL_MEMORY_ACCESS,
        re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"),
    ),
    (
        CUDA_OOM,
        re.compile(r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUDA error: out of memory"),
    ),
    (
        NCCL_TIMEOUT,
        re.compile(
            r"Watchdog caught collective operation timeout"
            r"|Some NCCL operations have failed or timed out"
            r"|ProcessGroupNCCL\S*\s.*timed out"
            r"|Heartbeat monitor timed out"
            r"|NCCL communicator was aborted"
        ),
    ),
    (XID, re.compile(r"NVRM: Xid\b|GPU has fallen off the bus")),
    (
        CUDA_ERROR,
        re.compile(
            r"\bCUDA error:"
            r"|device-side assert triggered"
            r"|unspecified launch failure"
            r"|CUBLAS_STATUS_(?!SUCCESS)[A-Z_]+"
            r"|CUDNN_STATUS_(?!SUCCESS)[A-Z_]+"
            r"|uncorrectable ECC error"
        ),
    ),
    (
        KILLED,
        re.compile(
            r"^\s*Killed\s*$"
            r"|\d+\s+Killed\s"
            r"|\bsignal 9\b|\bSIGKILL\b"
            r"|exitcode:\s*-9\b"
            r"|\bexit(?:ed)?(?:\s+with)?(?:\s+code|\s+status|code)\s*:?\s*137\b"
            r"|oom-killer|Out of memory: Killed process",
            re.IGNORECASE,
        ),
    ),
    (TRACEBACK, re.compile(r"Traceback \(most recent call last\)")),
)

PATTERN_NAMES: tuple[str, ...] = tuple(name for name, _ in PATTERNS)


def match(message: str) -> str | None:
    """The name of the first fatal-error pattern `message` matches, or None for an ordinary line."""
    for name, pattern in PATTERNS:
        if pattern.search(message):
            return name
    return None
