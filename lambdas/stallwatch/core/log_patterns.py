"""Notable lines in training logs: fatal errors and checkpoint markers, the one table both signal sources use.

    match("RuntimeError: CUDA error: an illegal memory access was encountered")  # "illegal_memory_access"
    match("step 120 loss 2.31")  # None
    marker("Saving model checkpoint to /opt/ml/checkpoints/checkpoint-500")  # "checkpoint_start"

The first pattern that matches names the line, so the specific ones come before the general ones. The AWS source
asks CloudWatch Logs for these lines only (`FILTER_PATTERN`, a superset of both tables), so a fatal line among
512 busy hosts is one page away; the regexes here decide.
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


# Checkpoint markers: a checkpoint's start line and its end line. A host whose newest marker is a start, with no other
# line since, is writing a checkpoint (a live job, even with idle GPUs and silent logs).
CHECKPOINT_START = "checkpoint_start"
CHECKPOINT_END = "checkpoint_end"
_CHECKPOINT = r"(?:checkpoint|ckpt)"
MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (CHECKPOINT_START, re.compile(rf"{_CHECKPOINT}\S*.{{0,80}}\bis about to be saved", re.IGNORECASE)),
    (
        CHECKPOINT_END,
        re.compile(
            rf"\b(?:saved|wrote|written|finished saving|done saving|uploaded)\b.{{0,60}}{_CHECKPOINT}"
            rf"|{_CHECKPOINT}\S*\b.{{0,80}}\b(?:saved|written|completed?|done|finished|is ready now|uploaded)\b",
            re.IGNORECASE,
        ),
    ),
    (
        CHECKPOINT_START,
        re.compile(
            rf"\b(?:saving|writing|storing|uploading|persisting|staging)\b.{{0,60}}{_CHECKPOINT}"
            rf"|\b{_CHECKPOINT}\S*\b.{{0,40}}\b(?:saving|writing|in progress|started)\b"
            r"|\bsaving (?:the )?model\b",
            re.IGNORECASE,
        ),
    ),
)

# Literal phrases, one of which every fatal line above contains (CloudWatch Logs matches them case-sensitively):
# FilterLogEvents and the subscription filter return only the lines holding one, and the regexes decide among them.
FATAL_FILTER_TERMS: tuple[str, ...] = (
    # NCCL and the process group's watchdog
    "Watchdog caught collective operation timeout",
    "NCCL operations have failed or timed out",
    "ProcessGroupNCCL",
    "Heartbeat monitor timed out",
    "NCCL communicator was aborted",
    # CUDA, the driver and the GPUs
    "illegal memory access",
    "cudaErrorIllegalAddress",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA out of memory",
    "OutOfMemoryError",
    "CUDA error",
    "NVRM: Xid",
    "fallen off the bus",
    "device-side assert",
    "unspecified launch failure",
    "CUBLAS_STATUS_",
    "CUDNN_STATUS_",
    "uncorrectable ECC error",
    # the kernel and the launcher killing the process
    "Killed",
    "killed",
    "KILLED",
    "SIGKILL",
    "signal 9",
    "Signal 9",
    "exitcode",
    "ExitCode",
    "exit code",
    "Exit code",
    "exit status",
    "Exit status",
    "exited with",
    "oom-killer",
    "Out of memory",
    "Traceback",
)
# ... and one of which every checkpoint marker line contains.
CHECKPOINT_FILTER_TERMS: tuple[str, ...] = (
    "checkpoint",
    "Checkpoint",
    "CHECKPOINT",
    "ckpt",
    "saving model",
    "Saving model",
    "saving the model",
    "Saving the model",
)
# The trainer agent's EMF document (trainer_agent.emf) opens with its "_aws" metadata.
AGENT_WINDOW_PREFIX = '{"_aws"'
FILTER_TERMS = FATAL_FILTER_TERMS + CHECKPOINT_FILTER_TERMS


def _any_of(terms: tuple[str, ...]) -> str:
    """A filter pattern matching a line that holds any of the phrases."""
    return " ".join(f'?"{term}"' for term in terms)


# Filter patterns (at most 1,024 characters each, CloudWatch Logs API reference): the fatal lines alone (the
# subscription filter's), the checkpoint markers alone, and FilterLogEvents' notable lines (both).
FATAL_FILTER_PATTERN = _any_of(FATAL_FILTER_TERMS)
CHECKPOINT_FILTER_PATTERN = _any_of(CHECKPOINT_FILTER_TERMS)
FILTER_PATTERN = _any_of(FILTER_TERMS)


def marker(message: str) -> str | None:
    """CHECKPOINT_START or CHECKPOINT_END for a checkpoint's start or end line, else None (ask `match` first: a
    fatal line is never a marker)."""
    for name, pattern in MARKERS:
        if pattern.search(message):
            return name
    return None


def agent_window(message: str) -> bool:
    """Whether `message` is the trainer agent's EMF line (its stdout sink): the agent's thread speaks, not the
    training loop, so it says nothing of what the loop does."""
    return message.startswith(AGENT_WINDOW_PREFIX)


def notable(message: str) -> bool:
    """Whether the server-side filter keeps `message` (a superset of the fatal and marker lines)."""
    return any(term in message for term in FILTER_TERMS)


def classify(message: str) -> tuple[str | None, str | None]:
    """(fatal pattern, checkpoint marker) of a line; (None, None) for the ordinary ones, which `FILTER_PATTERN`
    would not even return."""
    if not notable(message):
        return None, None
    pattern = match(message)
    return pattern, None if pattern else marker(message)
