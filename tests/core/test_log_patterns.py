"""Fatal-error patterns: real-looking NCCL, CUDA, driver, kernel and Python lines, and benign lookalikes."""

from __future__ import annotations

import pytest

from localrun import moto_logs_filter
from stallwatch.core import log_patterns
from stallwatch.core.log_patterns import PATTERN_NAMES, match

FATAL_LINES = [
    (
        "[rank3]:[E ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=48213, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600124 "
        "milliseconds before timing out.",
        "nccl_timeout",
    ),
    (
        "[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out. Due to the asynchronous "
        "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        "nccl_timeout",
    ),
    (
        "[rank0]:[E1130 09:12:01.123 ProcessGroupNCCL.cpp:1316] [PG 0 (default_pg) Rank 0] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress; the collective timed out",
        "nccl_timeout",
    ),
    (
        "[PG ID 0 PG GUID 0(default_pg) Rank 5] Heartbeat monitor timed out! Process will be terminated "
        "after dumping debug info.",
        "nccl_timeout",
    ),
    (
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call",
        "illegal_memory_access",
    ),
    ("torch.AcceleratorError: CUDA error: cudaErrorIllegalAddress", "illegal_memory_access"),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_error"),
    ("RuntimeError: CUDA error: unspecified launch failure", "cuda_error"),
    (
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, "
        "m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, CUDA_R_32F, "
        "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`",
        "cuda_error",
    ),
    (
        "[Mon Nov 30 09:14:22 2026] NVRM: Xid (PCI:0000:10:1c): 79, pid=4242, name=python, GPU has fallen off the bus.",
        "xid",
    ),
    ("NVRM: Xid (PCI:0000:a0:1c): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error", "xid"),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
        "79.10 GiB of which 1.06 GiB is free.",
        "cuda_oom",
    ),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB", "cuda_oom"),
    ("Traceback (most recent call last):", "traceback"),
    ("[rank7]: Traceback (most recent call last):", "traceback"),
    ("Killed", "killed"),
    ("/bin/sh: line 1:  4242 Killed                  python train.py --config cfg.yaml", "killed"),
    (
        "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 2 (pid: 311) "
        "of binary: /opt/conda/bin/python",
        "killed",
    ),
    ("Signal 9 (SIGKILL) received by PID 311", "killed"),
    ("subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 137.", "killed"),
    ("ExitCode 137", "killed"),
    ("[Mon Nov 30 09:20:01 2026] python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE)", "killed"),
    ("Out of memory: Killed process 311 (python) total-vm:912345678kB", "killed"),
]

BENIGN_LINES = [
    "checkpoint saved to s3://bucket/run-7/step-12000",
    "nccl init ok",
    "NCCL INFO Init COMPLETE comm 0x5581 rank 0 nranks 16 cudaDev 0 busId 101c0 - Init COMPLETE",
    "ProcessGroupNCCL initialized with timeout 600000 ms",
    "NCCL_TIMEOUT=1800 exported",
    "CUDA available: True, devices: 8",
    "No CUDA errors detected in the smoke test",
    "step 137 loss 2.31 lr 3e-4",
    "process exited normally after 137 steps",
    "killed_workers=0 respawned=0",
    "epoch 3 done in 1370.2 s",
    "CUBLAS_STATUS_SUCCESS",
    "",
]


@pytest.mark.parametrize(("line", "expected"), FATAL_LINES)
def test_fatal_line_is_named_by_its_pattern(line: str, expected: str) -> None:
    # Given a line a failing training job writes / When it is matched / Then the pattern that names it
    assert match(line) == expected


@pytest.mark.parametrize("line", BENIGN_LINES)
def test_benign_lookalike_matches_nothing(line: str) -> None:
    assert match(line) is None


def test_every_pattern_is_exercised_by_a_fatal_line() -> None:
    # Given the table / Then each of its patterns names at least one real line above
    assert {expected for _, expected in FATAL_LINES} == set(PATTERN_NAMES)


def test_specific_pattern_wins_over_the_traceback_it_comes_with() -> None:
    # Given a multi-line event holding both a traceback and the CUDA OOM it reports
    event = "Traceback (most recent call last):\n  File 'train.py', line 9\ntorch.OutOfMemoryError: CUDA out of memory."
    # Then the specific cause names it
    assert match(event) == "cuda_oom"


CHECKPOINT_LINES = [
    ("Saving model checkpoint to /opt/ml/checkpoints/checkpoint-500", "checkpoint_start"),  # Hugging Face Trainer
    ("[Torch] Checkpoint global_step1200 is about to be saved!", "checkpoint_start"),  # DeepSpeed
    ("[Torch] Checkpoint global_step1200 is ready now!", "checkpoint_end"),
    ("saving checkpoint at iteration    1000 to /fsx/ckpt", "checkpoint_start"),  # Megatron-LM
    ("  successfully saved checkpoint at iteration    1000 to /fsx/ckpt", "checkpoint_end"),
    ("Saving the checkpoint (or staging if async is enabled).", "checkpoint_start"),  # torchtitan
    ("Finished saving the checkpoint (or staging if async is enabled)in 12.31 seconds.", "checkpoint_end"),
    ("checkpoint saved to s3://bucket/run-7/step-12000", "checkpoint_end"),
    ("Epoch 0, global step 100: 'val_loss' reached 0.50, saving model to '/ckpt/e0.ckpt' as top 1", "checkpoint_start"),
]
NOT_MARKERS = [
    "gradient_checkpointing=True",
    "Loading checkpoint shards: 100%|##########| 4/4",
    "resuming from checkpoint step 1200",
    "step 1200 loss 2.31",
]


@pytest.mark.parametrize(("line", "expected"), CHECKPOINT_LINES)
def test_checkpoint_start_and_end_lines_are_markers(line: str, expected: str) -> None:
    assert log_patterns.classify(line) == (None, expected)


@pytest.mark.parametrize("line", NOT_MARKERS)
def test_lines_that_only_mention_checkpoints_are_not_markers(line: str) -> None:
    assert log_patterns.classify(line) == (None, None)


@pytest.mark.parametrize("line", [line for line, _ in FATAL_LINES + CHECKPOINT_LINES])
def test_the_server_side_filter_keeps_every_line_the_patterns_name(line: str) -> None:
    # Given a fatal or marker line / Then one of the filter's phrases is in it (CloudWatch Logs returns it)
    assert log_patterns.notable(line)


def test_the_filter_pattern_fits_filter_log_events_and_quotes_every_phrase() -> None:
    # FilterLogEvents takes a filterPattern of at most 1,024 characters (CloudWatch Logs API reference)
    pattern = log_patterns.FILTER_PATTERN
    assert len(pattern) <= 1024
    assert pattern.split(" ?")[0].startswith('?"')
    assert all('"' not in term for term in log_patterns.FILTER_TERMS)


@pytest.mark.parametrize("line", [line for line, _ in FATAL_LINES])
def test_the_fatal_filter_keeps_every_fatal_line(line: str) -> None:
    # Given a fatal line / Then the subscription filter's pattern (fatal lines alone) keeps it
    assert moto_logs_filter.TermsFilter(log_patterns.FATAL_FILTER_PATTERN).matches(line)


@pytest.mark.parametrize("line", [line for line, _ in CHECKPOINT_LINES])
def test_the_fatal_filter_leaves_checkpoint_markers_to_the_checkpoint_filter(line: str) -> None:
    assert not moto_logs_filter.TermsFilter(log_patterns.FATAL_FILTER_PATTERN).matches(line)
    assert moto_logs_filter.TermsFilter(log_patterns.CHECKPOINT_FILTER_PATTERN).matches(line)
