"""Fatal kinds and checkpoint markers, one line per format the frameworks write, benign lookalikes, and the
server-side filters as CloudWatch Logs applies them (the real lines are in test_real_lines.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

import pytest

from localrun import moto_logs_filter
from stallwatch.core import log_patterns
from stallwatch.core.log_patterns import PATTERN_NAMES, LinePatterns, match

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
        "[rank0]:[E1130 09:12:01.123 ProcessGroupNCCL.cpp:1316] [PG 0 (default_pg) Rank 0] ProcessGroupNCCL's "
        "watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.",
        "nccl_timeout",
    ),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 5] Heartbeat monitor timed out! Process will be terminated.", "nccl_timeout"),
    ("RuntimeError: NCCL communicator was aborted on rank 3.", "nccl_timeout"),
    ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.", "nccl"),
    ("node-7:311:402 [2] NCCL WARN NET/IB : Got completion from peer 10.1.2.3<40418> with error 12", "nccl"),
    ("torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:219, unhandled system error", "nccl"),
    ("node-7:311:402 [2] NCCL WARN NET/OFI Request 0x7f completed with error. RC: 21. Error: unknown error", "efa"),
    ("WARN: Function: main Line: 66: NET/OFI OFI NCCL failure: 2", "efa"),
    (
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 3/4 clients joined.",
        "c10d_timeout",
    ),
    (
        "[E socket.cpp:957] [c10d] The client socket has timed out after 900s while trying to connect to (h, 29500).",
        "c10d_timeout",
    ),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "c10d_timeout"),
    (
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call",
        "illegal_memory_access",
    ),
    ("torch.AcceleratorError: CUDA error: cudaErrorIllegalAddress", "illegal_memory_access"),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_error"),
    ("RuntimeError: CUDA error: unspecified launch failure", "cuda_error"),
    (
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb)`",
        "cuda_error",
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
        "79.10 GiB of which 1.06 GiB is free.",
        "cuda_oom",
    ),
    (
        "[Mon Nov 30 09:14:22 2026] NVRM: Xid (PCI:0000:10:1c): 79, pid=4242, name=python, GPU has fallen off the bus.",
        "xid",
    ),
    ("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", "xid"),
    ("[Mon Nov 30 09:20:01 2026] python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE)", "oom_kill"),
    ("Out of memory: Killed process 311 (python) total-vm:912345678kB", "oom_kill"),
    ("RuntimeError: DataLoader worker (pid 6000) is killed by signal: Killed.", "oom_kill"),
    ("Segmentation fault (core dumped)", "segfault"),
    ("*** SIGSEGV (@0x0) received by PID 1234 (TID 0x7f) from PID 0; stack trace: ***", "segfault"),
    ("terminate called after throwing an instance of 'std::runtime_error'", "sigabrt"),
    ("Fatal Python error: Aborted", "sigabrt"),
    ("Bus error (core dumped)", "bus_error"),
    ("slurmstepd: error: *** JOB 1234 ON node-3 CANCELLED AT 2026-01-05T10:11:12 DUE TO NODE FAILURE ***", "slurm"),
    ("srun: error: node-3: task 3: Killed", "slurm"),
    ("srun: error: node-3: tasks 0-7: Exited with exit code 1", "slurm"),
    ("srun: error: Node failure on node-3", "slurm"),
    ("mpirun noticed that process rank 0 with PID 4242 on node node-1 exited on signal 9 (Killed).", "mpi"),
    ("[node-1:04242] *** Process received signal ***", "mpi"),
    ("2026-01-05 10:11:12,123 sagemaker-training-toolkit ERROR    Reporting training FAILURE", "sagemaker_toolkit"),
    ("2026-01-05 10:11:12,124 sagemaker-training-toolkit ERROR    ExecuteUserScriptError:", "sagemaker_toolkit"),
    ("[2026-01-05 10:11:12,125] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 4242", "deepspeed_launcher"),
    (
        "[2026-01-05 10:11:12,126] [ERROR] [launch.py:321:sigkill_handler] ['python'] exits with return code = -9",
        "deepspeed_launcher",
    ),
    ("  exitcode  : -9 (pid: 311)", "launcher_exit"),
    ("  exitcode  : 1 (pid: 312)", "launcher_exit"),
    (
        "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -6) local_rank: 2 (pid: 311)",
        "launcher_exit",
    ),
    ("  traceback : Signal 9 (SIGKILL) received by PID 311", "launcher_exit"),
    (
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 311 closing signal SIGTERM",
        "launcher_exit",
    ),
    ("train.py FAILED", "launcher_exit"),
    (
        "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 137.",
        "launcher_exit",
    ),
    ("ExitCode 137", "launcher_exit"),
    ("Killed", "killed"),
    (" 20%|████                | 216/1063 [00:27<02:17,  6.17it/s]Killed", "killed"),
    ("/bin/sh: line 1:  4242 Killed                  python train.py --config cfg.yaml", "killed"),
    ("Traceback (most recent call last):", "traceback"),
    ("[rank7]: Traceback (most recent call last):", "traceback"),
    ("ValueError: too many values to unpack (expected 2)", "python_exception"),
    ("RuntimeError: NCCL Error 2: unhandled system error", "nccl"),
    ("NET/IB : Got completion from peer 10.0.0.1<1234> with status=12 opcode=0 len=0 vendor err 129 (Recv)", "nccl"),
    ("NVRM: Xid (0000:03:00): 13, 0000 00000000 0000c197 00000000 00000000", "xid"),
    ("Mar 10 01:33:03 cpu-6-2 kernel: Killed process 1234 (python) total-vm:1kB, anon-rss:1kB", "oom_kill"),
    ("slurmstepd: error: Exceeded step memory limit at some point.", "oom_kill"),
    ("RuntimeError: Process 0 terminated with exit code 1", "launcher_exit"),
    (
        "WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers",
        "launcher_exit",
    ),
    ("[E socket.cpp:860] [c10d] The server socket has failed to listen on any local network address.", "c10d_timeout"),
    # the Neuron runtime's layout (level, COMPONENT:function, message), its status codes and its TensorFlow wrapper
    ("2025-Mar-02 10:11:12.0001 4242:4242 ERROR  NRT:nrt_init   Failure: NRT_UNINITIALIZED in nrt_init()", "neuron"),
    (
        "1: 2022-05-26 01:44:11.574098: E tensorflow/neuron/runtime/model.cc:706] shard error code 13, error message "
        'nrt::infer_wait failed with grpc status code 0, error message ""; nrt status code 1004, details '
        '"[NMGR:exec_wait] Inference completed with err: 1004',
        "neuron",
    ),
    ("node-7:311:402 [2] CCOM WARN Call to recv from 10.1.2.3<40418> failed : Connection reset by peer", "nccl"),
    (
        "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: during context [hlo verifier]: Expected instruction to have "
        "shape equal to f32[16,2,1000,336,3], actual shape is f32[1000,16,2,336,3]:",
        "xla",
    ),
    ("RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer", "xla"),
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.", "ray"),
    ("TERM_CPULIMIT: job killed after reaching LSF CPU usage limit.", "lsf"),
    ("salloc: Job allocation 235454 has been revoked.", "slurm"),
    ("slurmstepd: error: execve(): /tmp/slurmd/job00089/slurm_script: No such file or directory", "slurm"),
    ("socketProgressOpt: Call to recv from 172.16.0.9<33759> failed : Connection reset by peer", "nccl"),
    ("2022-06-02 17:28:14 Failed - Training job failed", "sagemaker_toolkit"),
    ("python3: /opt/workspace/tdrv/ring.c:41: ring_init: Assertion `ring != NULL' failed.", "sigabrt"),
    # a write that dies of its errno; a pod's terminal state as kubectl shows it; the shell's report of a signal death
    ("RuntimeError: write(): fd 29 failed with Input/output error", "storage"),
    ("[  279.665960] EXT4-fs (nvme0n1p1): Remounting filesystem read-only", "storage"),
    ("      Reason:       CrashLoopBackOff", "kubernetes"),
    ("The node was low on resource: memory.", "kubernetes"),
    ("./train.sh: line 3:  1098 Floating point exception(core dumped) python train.py --dataset=dtu_yao", "killed"),
    (
        "Oct 24 06:17:10 pinnacle systemd[1]: traccar.service: Main process exited, code=exited, status=143/n/a",
        "launcher_exit",
    ),
    # read fatal by structure, then named by their family's words
    ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]]', "container"),
    ("[ 1097.650222] NVRM: GPU 0000:04:01.0: RmInitAdapter failed! (0x11:0x45:2525)", "xid"),
    (
        "libfabric:15409:1705531788::efa:mr:efa_mr_reg_impl():850<warn> Unable to register MR: Cannot allocate memory",
        "efa",
    ),
    # no family names these: an error mark with a failure word, or a fatal mark alone
    (
        "E0929 17:42:48.594192 1044529 coordination_service_agent.cc:332] Polled an error from coordination service "
        "(this can be an error from this or another task).",
        "error",
    ),
    ("2026-01-05 10:11:12,123 - trainer - ERROR - data shard 17 could not be read, aborting", "error"),
    ("F0423 12:34:56.789012 4242 device_manager.cc:88] Check failed: devices.size() == 8", "error"),
]

BENIGN_LINES = [
    "checkpoint saved to s3://bucket/run-7/step-12000",
    "NCCL INFO Init COMPLETE comm 0x5581 rank 0 nranks 16 cudaDev 0 busId 101c0 - Init COMPLETE",
    "node-1:311:311 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.",
    "node-1:311:402 [0] nccl_net_ofi_create_plugin:257 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
    "ProcessGroupNCCL initialized with timeout 600000 ms",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "No CUDA errors detected in the smoke test",
    "step 137 loss 2.31 lr 3e-4",
    "  exitcode  : 0 (pid: 311)",
    "Process exited with exit code 0",
    "[2026-01-05 10:11:12,126] [INFO] [launch.py:351:main] Process 311 exits successfully.",
    "killed_workers=0 respawned=0",
    "Killed 0 processes",
    " 45%|████▌     | 450/1000 [10:23<12:41,  1.39s/it]",
    "CUBLAS_STATUS_SUCCESS",
    "[  +0.000005] pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer",
    "r8169 0000:03:00.0 eth0: RTL8125B, 58:47:ca:7b:55:71, XID 641, IRQ 51",
    "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99).",
    "NVRM: Xid (0000:03:00): 63, pid=1, Row Remapper: New row marked for remapping",
    "wandb: Network error (TransientError), entering retry loop.",
    "/opt/conda/lib/python3.10/site-packages/torch/utils/checkpoint.py:90: UserWarning: None of the inputs have "
    "requires_grad=True. Gradients will be None",
    "2026-01-05 10:11:12,123 sagemaker-training-toolkit INFO     Reporting training SUCCESS",
    "",
    "[ERROR] First test message",  # an error mark with nothing said to have failed (AWS's sample delivery)
    # lines that say the job goes on: a retry, a skipped batch, an ignored exception, a fallback, a Python warning
    "wandb: Network error (ReadTimeout), entering retry loop.",
    "node-7:311:402 [2] NCCL WARN Call to connect returned Connection refused, retrying",
    "| WARNING: ran out of memory with exception: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0);",
    "WARNING skipping a corrupt record: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0",
    "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f7162a08af0>",
    "[2023-08-14 14:53:48,863] torch._dynamo.output_graph: [WARNING] Falling back to eager for this frame.",
    "slurmstepd: error: couldn't chdir to `/root/burst-buffer': No such file or directory: going to /tmp instead",
    "/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py:138: UserWarning: CUDA initialization: CUDA "
    "driver initialization failed, you might not have a CUDA gpu.",
    # a socket error is not NCCL's unless NCCL or its transport says so; an experiment tracker's errors are its own
    "WARNING:urllib3.connectionpool:Retrying (Retry(total=4)) after connection broken by 'ProtocolError('Connection "
    "aborted.', ConnectionResetError(104, 'Connection reset by peer'))': /api/2.0/mlflow/runs/log-metric",
    "wandb: ERROR Failed to sample metric: Not Supported",
    # an error a probe reports at INFO level; a caught error logged at WARNING
    "I0223 22:58:05.579842 140312230876992 xla_bridge.py:660] Unable to initialize backend 'tpu': INTERNAL: Failed to "
    "open libtpu.so: libtpu.so: cannot open shared object file: No such file or directory",
    "[2023-07-31 11:08:28,980] torch._dynamo.convert_frame: [WARNING] Traceback (most recent call last):",
    "E0000 00:00:1723141151.233718 5214 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to register "
    "factory for plugin cuDNN when one has already been registered",
    # libfabric's warn while providers are probed (its core subsystem), a driver's notice of a healthy boot, a
    # deprecation that names an error variable, a watchdog that ended normally, a joblib warning quoting ENOSPC
    "libfabric:core:core:fi_getinfo_():545<warn> fi_getinfo: provider psm returned -61 (No data available)",
    "May 21 18:07:14 sangje-desktop kernel: [    8.020289] nvme nvme0: missing or invalid SUBNQN field.",
    "[W Utils.hpp:135] Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function getCvarInt)",
    "I1002 15:18:51.080338 1822035 ProcessGroupNCCL.cpp:530] [Rank 1] NCCL watchdog thread terminated normally",
    "/root/miniconda3/envs/vits/lib/python3.8/site-packages/joblib/_multiprocessing_helpers.py:46: UserWarning: [Errno "
    "28] No space left on device.  joblib will operate in serial mode",
]


@pytest.mark.parametrize(("line", "expected"), FATAL_LINES)
def test_fatal_line_is_named_by_its_kind(line: str, expected: str) -> None:
    # Given a line a failing training job writes / When it is matched / Then the kind that names it
    assert match(line) == expected


@pytest.mark.parametrize("line", BENIGN_LINES)
def test_benign_lookalike_matches_nothing(line: str) -> None:
    assert match(line) is None


def test_every_built_in_kind_is_exercised_by_a_fatal_line() -> None:
    assert {expected for _, expected in FATAL_LINES} == set(PATTERN_NAMES) - {log_patterns.USER_FATAL}


def test_a_socket_error_alone_is_a_python_exception_not_nccl() -> None:
    # Given a DataLoader worker's socket error (no NCCL, no transport of its on the line)
    line = "ConnectionResetError: [Errno 104] Connection reset by peer"
    # Then it names an exception the engine weighs as any other (a line after it is life), not a collective's death
    assert match(line) == "python_exception"


@pytest.mark.parametrize(
    ("caught", "uncaught", "kind"),
    [
        (
            "2022-08-21 00:29:47 | WARNING | metaseq.trainer | OOM: Ran out of memory with exception: CUDA out of "
            "memory.",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "cuda_oom",
        ),
        (
            "INFO:root:retry budget left 2, last error ValueError: bad header",
            "ValueError: bad header",
            "python_exception",
        ),
        (
            "W0607 10:11:12.000000 4242 pjrt_client.cc:88] INTERNAL: RET_CHECK failure on a probe",
            "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: RET_CHECK failure",
            "xla",
        ),
    ],
    ids=["fairseq-oom", "python-logging", "xla-status"],
)
def test_a_strict_kind_logged_at_a_low_severity_is_a_caught_error(caught: str, uncaught: str, kind: str) -> None:
    # Given the same error logged by a framework that caught it (INFO, WARNING) and raised by one that did not
    # Then only the uncaught one is fatal
    assert match(caught) is None
    assert match(uncaught) == kind


def test_a_collectives_warn_is_its_error_level() -> None:
    # NCCL and the Neuron collectives print their errors at WARN: the level does not make them benign
    assert match("node-1:311:402 [0] NCCL WARN Net : Connection closed by remote peer 10.0.0.2<40318>") == "nccl"
    assert match("2023-Aug-01 16:12:43.0204 332066:332438 [21] bootstrap.cc:106 CCOM WARN Call to accept failed") == (
        "nccl"
    )


@pytest.mark.parametrize(
    "line",
    [
        "wandb: Network error (TransientError), entering retry loop.",
        "| WARNING: ran out of memory on GPU #2, skipping batch",
        "Exception ignored in: <bound method _DataLoaderIter.__del__ of <torch.utils.data.dataloader._DataLoaderIter>>",
        "[WARNING] Backend compiler failed with a fake tensor exception; falling back to eager",
        "Connect to localhost:33666 failed - retrying",
        "torch/cuda/__init__.py:138: UserWarning: CUDA initialization: CUDA driver initialization failed",
    ],
)
def test_a_line_that_says_the_job_goes_on_survives(line: str) -> None:
    # The engine may read such a line as the end of a harmless block (a traceback the job trained on after)
    assert log_patterns.survives(line)
    assert match(line) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[298850.502101] NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR nd-id=0 nc-id=0 action=TERMINATE_INSTANCE", "neuron"),
        ("RX, connection closed by remote peer", "neuron"),
        ("host:40211:40390 [3] handle_error_entry:1342 NCCL WARN NET/OFI Fatal: rx buffer recv completed", "efa"),
        ("ray.exceptions.LocalRayletDiedError: The task's local raylet died.", "ray"),
        ("ray.train.v2.api.exceptions.WorkerGroupError: Training failed due to worker errors:", "ray"),
        ("[rank: 0] Received SIGTERM: 15", "killed"),
        ("Detected KeyboardInterrupt, attempting graceful shutdown ...", "killed"),
    ],
)
def test_a_runtime_s_own_death_message_is_named(line: str, expected: str) -> None:
    # Messages as the Neuron docs, aws-ofi-nccl, Ray and Lightning print them (corpus/source_lines/fatal.jsonl)
    assert match(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "[298850.919248] efa 0000:a0:1a.0 rdmap160s26: Failed to process command DEREG_MR (opcode 8) err -22",
        "Fri Feb  1 10:52:23: Pending: Requeued job is waiting for rescheduling;(exit code 17)",
        "Timeout waiting for RX (waited 120 sec) - retrying",
        "Bypassing SIGTERM: 15",
    ],
)
def test_a_runtime_s_lookalike_is_ordinary(line: str) -> None:
    # EFA's deregistration after the process ended, LSF's requeue, the Neuron collectives' wait, a signal let pass
    assert match(line) is None


def test_an_ordinary_or_fatal_line_does_not_survive() -> None:
    for line in ["step 120 loss 2.31", "Killed", "srun: error: node-3: task 3: Killed", "RuntimeError: CUDA error"]:
        assert not log_patterns.survives(line)


def test_a_users_fatal_line_is_named_even_when_it_says_it_retries() -> None:
    # A deployment's own fatal regex is its word: the built-in benign shapes do not overrule it
    patterns = LinePatterns.extended(fatal=[r"giving up after \d+ retries"])
    assert patterns.match("loader: retrying; giving up after 5 retries") == log_patterns.USER_FATAL


def test_specific_kind_wins_over_the_traceback_it_comes_with() -> None:
    # Given a multi-line event holding both a traceback and the CUDA OOM it reports
    event = "Traceback (most recent call last):\n  File 'train.py', line 9\ntorch.OutOfMemoryError: CUDA out of memory."
    # Then the specific cause names it
    assert match(event) == "cuda_oom"


@pytest.mark.parametrize("code", [13, 31, 43, 45, 48, 61, 62, 74, 79, 92, 94, 95, 109, 119, 120])
def test_a_fatal_xid_is_a_death(code: int) -> None:
    assert match(f"[  219.47] NVRM: Xid (PCI:0000:07:00): {code}, pid=4242, name=python3, some text") == "xid"


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:07:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping",
        "NVRM: Xid (PCI:0000:07:00): 64, pid='<unknown>', name=<unknown>, Dynamic Page Retirement: Blacklisting failed",
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008)",
    ],
    ids=["63", "64", "nvlink-nonfatal"],
)
def test_an_informational_xid_is_not(line: str) -> None:
    # Given NVIDIA's catalogue: a row marked for remapping, a remapping not recorded, a non-fatal NVLink event
    assert match(line) is None


def test_a_fatal_nvlink_xid_is_a_death() -> None:
    assert match("NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x0)") == "xid"


@pytest.mark.parametrize(
    ("failed", "succeeded"),
    [
        ("  exitcode  : -11 (pid: 5277)", "  exitcode  : 0 (pid: 5277)"),
        ("failed (exitcode: 2) local_rank: 0 (pid: 1) of binary: /usr/bin/python", "(exitcode: 0) local_rank: 0"),
        ("[launch.py:321:sigkill_handler] ['python'] exits with return code = 1", "exits with return code = 0"),
        ("srun: error: node-2: task 1: Exited with exit code 2", "srun: node-2: task 1: Exited with exit code 0"),
        ("pdsh@node-1: node-2: ssh exited with exit code 255", "ssh exited with exit code 0"),
        ("AlgorithmError: ExitCode 139", "ExitCode 0"),
    ],
    ids=["torchrun-summary", "torch-elastic", "deepspeed", "srun", "pdsh", "sagemaker"],
)
def test_exit_codes_are_read_in_every_launchers_format(failed: str, succeeded: str) -> None:
    assert match(failed) is not None
    assert match(succeeded) is None


CHECKPOINT_LINES = [
    ("Saving model checkpoint to /opt/ml/checkpoints/checkpoint-500", "checkpoint_start"),  # Transformers Trainer
    ("Configuration saved in /opt/ml/checkpoints/checkpoint-500/config.json", "checkpoint_start"),  # a file of it
    ("Model weights saved in /opt/ml/checkpoints/checkpoint-500/model.safetensors", "checkpoint_start"),
    ("Deleting older checkpoint [/opt/ml/checkpoints/checkpoint-250] due to args.save_total_limit", "checkpoint_end"),
    ("[Torch] Checkpoint global_step1200 is about to be saved!", "checkpoint_start"),  # DeepSpeed
    ("[Torch] Saved /ckpt/global_step1200/mp_rank_00_model_states.pt.", "checkpoint_start"),  # a file of it
    ("zero checkpoint saved /ckpt/global_step1200/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "checkpoint_start"),
    ("[Torch] Checkpoint global_step1200 is ready now!", "checkpoint_end"),
    ("saving checkpoint at iteration    1000 to /fsx/ckpt", "checkpoint_start"),  # Megatron-LM
    ("  scheduled an async checkpoint save at iteration       1000 to /fsx/ckpt", "checkpoint_start"),
    ("  successfully saved checkpoint at iteration    1000 to /fsx/ckpt", "checkpoint_end"),
    ("  successfully saved checkpoint from iteration    1000 to /fsx/ckpt [ t 1/8, p 1/1 ]", "checkpoint_end"),
    ("Saving the checkpoint (or staging if async is enabled).", "checkpoint_start"),  # torchtitan
    ("Finished saving the checkpoint (or staging if async is enabled)in 12.31 seconds.", "checkpoint_end"),
    ("Preparing to save checkpoint for epoch 1 @ 2000 updates", "checkpoint_start"),  # metaseq
    (
        "Saved checkpoint /ckpt/checkpoint_2000.pt (epoch 1 @ 2000 updates) (writing took 12.3 seconds)",
        "checkpoint_end",
    ),
    (
        "[NeMo I 2026-01-05 10:11:12 nemo:393] Pending async checkpoint saves. Finalizing them synchronously now",
        "checkpoint_start",
    ),
    (
        "[NeMo I 2026-01-05 10:11:12 nemo_logging:393] Scheduled async checkpoint save for /ckpt/step=99-last.ckpt",
        "checkpoint_start",
    ),
    ("Async checkpoint save for step 100 (/ckpt/step=99-last.ckpt) finalized successfully.", "checkpoint_end"),
    ("Epoch 0, global step 100: 'val_loss' reached 0.50, saving model to '/ckpt/e0.ckpt' as top 1", "checkpoint_start"),
    ("checkpoint saved to s3://bucket/run-7/step-12000", "checkpoint_end"),
    ("chat template saved in /out/checkpoint-5/chat_template.jinja", "checkpoint_start"),
    ("=> saving checkpoint 'checkpoint.pth.tar'", "checkpoint_start"),
    ("Saving checkpoint took 36.72 secs", "checkpoint_end"),  # torchtune
    # Orbax, in its source's words: a step's tmp directory and write throughput while it writes; its finalize lines
    ("Creating tmp directory /ckpt/19.orbax-checkpoint-tmp", "checkpoint_start"),
    ("[process=0] /jax/checkpoint/write/bytes_per_sec: 118.7 MiB/s (total bytes: 7.0 GiB)", "checkpoint_start"),
    ("Finished asynchronous save (blocking + background) in 27.50 seconds to /ckpt/5000", "checkpoint_end"),
    (
        "[process=0][thread=save_finalize][step=5000] CheckpointManager Save Finalize is done on all hosts.",
        "checkpoint_end",
    ),
    ("12/01/2026 10:11:12 - INFO - __main__ - Saved state to /out/checkpoint-500", "checkpoint_end"),  # Accelerate
    (
        "10:11:12 - INFO - accelerate.checkpointing - Optimizer state saved in /out/checkpoint-500/optimizer.bin",
        "checkpoint_start",
    ),
    (
        "The best checkpoint with 0.8150 accuracy/top1 at 10 epoch is saved to best_accuracy_top1_epoch_10.pth.",
        "checkpoint_end",
    ),  # mmengine
    ("Saving checkpoint at 1000 iterations", "checkpoint_start"),  # mmengine
    ("Saved checkpoint for step 9485", "checkpoint_end"),  # Levanter
]
NOT_MARKERS = [
    "gradient_checkpointing=True",
    "Loading checkpoint shards: 100%|##########| 4/4",
    "resuming from checkpoint step 1200",
    "step 1200 loss 2.31",
    "Epoch 3, global step 2000: 'val_loss' was not in top 3",
    "[INFO] [config.py:964:print]   load_universal_checkpoint .... False",
    "time (ms) | save-checkpoint: 57514.53",
    "[INFO] [checkpointing.py:226:model_parallel_cuda_manual_seed] > initializing model parallel cuda seeds",
    "Loading checkpoint from /fsx/ckpt/step-1200",
]


@pytest.mark.parametrize(("line", "expected"), CHECKPOINT_LINES)
def test_checkpoint_start_and_end_lines_are_markers(line: str, expected: str) -> None:
    assert log_patterns.classify(line) == (None, expected)


@pytest.mark.parametrize("line", NOT_MARKERS)
def test_lines_that_only_mention_checkpoints_are_not_markers(line: str) -> None:
    assert log_patterns.classify(line) == (None, None)


# The lines libraries print, taken from their source's logging calls and their documentation (each record names its
# file and commit, or its page): a fatal line recognised and kept by the subscription filter, a save read as its
# marker and kept by the checkpoint filter, a lookalike neither.
SOURCE_LINES = [
    json.loads(line)
    for name in (
        "fatal",
        "fatal-2",
        "fatal-3",
        "fatal-4",
        "fatal-5",
        "fatal-6",
        "fatal-7",
        "fatal-10",
        "saves",
        "saves-2",
    )
    for line in (Path(__file__).parents[2] / "corpus" / "source_lines" / f"{name}.jsonl").read_text().splitlines()
    if line.strip()
]


@pytest.mark.parametrize("record", SOURCE_LINES, ids=lambda r: f"{r['framework']}:{r['text'][-40:]}")
def test_a_librarys_own_lines_are_read_as_its_source_writes_them(record: dict[str, str]) -> None:
    label, text = record["label"], record["text"]
    if label == "fatal":
        assert match(text) is not None
        assert moto_logs_filter.keeps(log_patterns.FATAL_FILTER_PATTERN, text)
    else:
        assert log_patterns.classify(text) == (None, None if label == "benign" else label)
        assert label == "benign" or moto_logs_filter.keeps(log_patterns.CHECKPOINT_FILTER_PATTERN, text)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # Megatron's rerun state machine exits and asks for the job to be resumed or examined: fatal at WARNING
        ("Exiting now. The job can be resumed from a previous checkpoint", "launcher_exit"),
        (
            "Exiting now. A checkpoint at the last iteration already exists if further examination is needed",
            "launcher_exit",
        ),
        # a planned exit, or one that names no resume, is no abort
        ("[exiting program at iteration 6000] datetime: 2026-08-25 19:54:10 ", None),
        ("Training finished. Exiting now.", None),
        ("Exiting now; the run can be resumed from the last checkpoint", "launcher_exit"),
    ],
)
def test_an_application_exiting_now_for_a_resume_is_fatal_at_any_level(line: str, expected: str | None) -> None:
    assert match(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # Ray Train's controller at ERROR: a worker group restarted goes on; one terminated ends training
        (
            "2026-08-25 19:54:10,294\tERROR controller.py:217 -- Restarting training worker group after encountering "
            "failures on 1 worker(s):",
            None,
        ),
        (
            "2026-08-25 19:54:10,294\tERROR controller.py:231 -- Terminating training worker group after encountering "
            "failure(s) on 1 worker(s):",
            "error",
        ),
        # its failure policy decides at INFO
        (
            "2026-08-25 19:54:10,294\tINFO default.py:33 -- Deciding to TERMINATE, since the total failure count (4) "
            "exceeded the maximum allowed failures: FailureConfig(max_failures=3).",
            "ray",
        ),
        (
            "2026-08-25 19:54:10,294\tINFO default.py:41 -- Deciding to RESTART, since the total failure count (2) <= "
            "FailureConfig(max_failures=3).",
            None,
        ),
        # an experiment tracker that could not be set up is no abort, even at ERROR quoting an exception
        (
            "[titan] 2026-08-25 19:54:10,294 - root - ERROR - Failed to create WandB logger: "
            "wandb.errors.CommError: Run initialization has timed out after 90.0 sec.",
            None,
        ),
    ],
)
def test_a_restart_or_a_side_channel_goes_on_and_giving_up_is_fatal(line: str, expected: str | None) -> None:
    assert match(line) == expected


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Setting unhealthy static nodes to DOWN", "slurm"),
        ("Setting unhealthy dynamic nodes to down and power_down.", "slurm"),
        ("Terminating instances backing unhealthy static nodes", "slurm"),
        # a DRAIN lets the running job finish; idle, powering-down and orphaned instances hold no job
        ("Setting nodes failing health check type ec2_health_check to DRAIN: {'q1-st-p5-3'}", None),
        ("Terminating instances that are backing powering down nodes", None),
        ("Terminating orphaned instances", None),
        ("Resetting nodeaddr/nodehostname and setting to down the following nodes: (x1) ['q1-st-p5-1']", None),
    ],
)
def test_parallelcluster_setting_nodes_down_under_a_job_is_fatal_at_info(message: str, expected: str | None) -> None:
    # Given clustermgtd's own frame, its actions logged at INFO or WARNING
    line = f"2026-08-25 19:54:10,294 - [slurm_plugin.clustermgtd:_maintain_nodes] - INFO - {message}"
    # Then a node set DOWN, or an unhealthy node's instance terminated, is fatal, and kept by the filter
    assert match(line) == expected
    assert expected is None or moto_logs_filter.keeps(log_patterns.FATAL_FILTER_PATTERN, line)
    # And the same words outside the plugin's frame are not read
    assert match(message) is None


# --- structures read from the written part of corpus/real_lines (round 39/2: Neuron, LSF, Ray, schedulers, saves) ---


@pytest.mark.parametrize(
    "line",
    [
        "2026-Apr-13 01:46:31.0675 837617:837663 [2] int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**):219 "
        "CCOM WARN NET/OFI Failed to initialize rdma protocol",
        "2026-Apr-13 01:46:31.0681 837617:837663 [2] ncclResult_t nccl_net_ofi_init_no_atexit_fini_v6"
        "(ncclDebugLogger_t):183 CCOM WARN NET/OFI Initializing plugin failed",
        "2026-Apr-13 01:46:31.0683 837617:837663 [2] net_plugin.cc:97 CCOM WARN OFI plugin initNet() failed is EFA "
        "enabled?",
    ],
)
def test_the_network_plugin_failing_to_initialise_is_a_fallback_not_a_collectives_death(line: str) -> None:
    # Given the Neuron collectives' start-up on a host without EFA (the Neuron docs: harmless, training goes on)
    # Then neither the collectives' WARN nor the EFA rule names it
    assert match(line) is None


def test_a_collectives_failure_after_start_up_is_still_named() -> None:
    line = "2023-Jun-14 19:05:29.0312 4112959:4113263 [14] include/socket.h:438 CCOM WARN Net : Socket creation failed"
    assert match(line + " : Too many open files") == "nccl"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # a compiler's error code leading the line, with what failed, named by the family its words name
        ("[F134] neuronx-cc terminated abnormally - Please open a support ticket at https://github.com/", "neuron"),
        ("[NLA001]  Unhandled exception with message: === BIR error ===", "error"),
        # an application's own Fatal: mark
        ("Fatal: Internal system error, cannot recover.", "error"),
        # glog's E with a failure word no family names
        (
            "2022-02-07 17:22:12.592170: E tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc:545] Unknown: "
            "Could not start gRPC server",
            "error",
        ),
        # libstdc++'s second line of an uncaught exception, ld.so's assertion
        ("  what():  === BIR verification failed ===", "sigabrt"),
        (
            "INFO: Inconsistency detected by ld.so: ../elf/dl-tls.c: 488: _dl_allocate_tls_init: Assertion "
            "`listp->slotinfo[cnt].gen <= GL(dl_tls_generation)' failed!",
            "sigabrt",
        ),
        # a scheduler's report of the signal that took a process
        ("Process terminated by User defined signal 2(12)", "killed"),
        # LSF's job report for a job that exited, Ray Tune's errored trials, Hydra's failed job
        ("Subject: Job 6410325: <NNAgent7NN-Selfplay-50-weighted-lr=0.00005> in cluster <dcc> Exited", "lsf"),
        ("Number of trials: 1/1 (1 ERROR)", "ray"),
        ("Number of errored trials: 1", "ray"),
        (
            "Error executing job with overrides: ['algorithm.adv_estimator=grpo......trainer.total_epochs=1']",
            "launcher_exit",
        ),
    ],
)
def test_a_fatal_line_is_read_by_its_structure(line: str, expected: str) -> None:
    assert match(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "0: fatal: not a git repository (or any of the parent directories): .git",  # git's, and the job goes on
        "E1025 08:58:19.650164 139866418210816 dataset_iterator.py:130] DatasetIterator.load() is deprecated. Please "
        "use restore().",  # an E mark with nothing said to have failed
        "Subject: Job 6464944: <NNAgent7NN-Selfplay-50-weighted-lr=0.00005> in cluster <dcc> Done",
        "Terminated at Mon May  4 08:24:53 2020",  # LSF's report of a job that completed
        "Number of trials: 976 (3 RUNNING, 973 TERMINATED)",
        "2022/08/22 15:51:54 - mmengine - INFO - Checkpoints will be saved to /home/mazerun/work_dir by "
        "HardDiskBackend.",
    ],
)
def test_a_lookalike_of_those_structures_is_neither_fatal_nor_a_marker(line: str) -> None:
    assert log_patterns.classify(line) == (None, None)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # a save verb in progress and what it saves (a model, its weights): a checkpoint begins or is being written
        ("Saving LoRA weights to 'out/finetune/lora-phi-2/final/lit_model.pth.lora'", "checkpoint_start"),
        ("INFO:accelerate.accelerator:Saving FSDP model", "checkpoint_start"),
        # Orbax's background save thread, Ultralytics' final weights
        (
            "20:15:21.008 [I] [process=0][thread=async_save] 3 Handler Commit operations completed.            "
            "(2406527:async_checkpointer.py:131)",
            "checkpoint_start",
        ),
        ("Optimizer stripped from runs/detect/train/weights/last.pt, 6.3MB", "checkpoint_start"),
        # a save verb in the past, what was saved, and where: a checkpoint's directory or a weights file
        ("Saved merged weights to 'out/finetune/lora-phi-2/final/lit_model.pth'", "checkpoint_end"),
        ("Saved Unet to tmp/test_FSDP/checkpoint_5_lora_dict.pkl", "checkpoint_end"),
    ],
)
def test_a_save_is_read_by_its_verb_what_it_saves_and_where(line: str, expected: str) -> None:
    assert log_patterns.classify(line) == (None, expected)


# --- structures read from round 39/4's written lines: levels and frames, failure words, families, saves by verb ----


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # the Neuron 1.x runtime daemon's lines (syslog, no level): a component's frame with a failure word
        ("Jan 08 21:53:19 ip-10-0-0-31 nrtd[4154]: [hal] request seq: 2, cmd: 1 timed out", "neuron"),
        ("nrtd[1]: [NRTD:nrtd_main] Failed to initialize devices: 0000:00:1c.0 , attempt: 1", "neuron"),
        # TensorFlow's op kernels report a failed op at W; its status codes, in either spelling
        (
            "2018-06-08 17:26:00.908130: W tensorflow/core/framework/op_kernel.cc:1202] OP_REQUIRES failed at "
            "tile_ops.cc:123 : Resource exhausted: OOM when allocating tensor with shape[16,1,892800,8,4,2,2]",
            "cuda_oom",
        ),
        ("  (0) Resource exhausted: OOM when allocating tensor with shape[16,112,112,147] and type float", "cuda_oom"),
        # and TensorFlow's exception with its parenthesis
        (
            "ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[64]",
            "python_exception",
        ),
        # NCCL's WARN is its error level, whatever the failure word
        ("[1,2]<stdout>:w-0:75:95 [2] graph/xml.h:101 NCCL WARN Attribute arch of node cpu not found", "nccl"),
        # unlevelled failures: a report's heading, a terminal state, a failure at a source location
        ("Failures:", "error"),
        ("Job 'raysubmit_7wNNGHdVi92R8wt2' failed", "error"),
        ("[1,2]<stdout>: .. test-nccl-p5-2-worker-0 pid 75: Test failure common.cu:844", "nccl"),
    ],
)
def test_a_line_no_signature_names_is_read_by_its_level_frame_and_failure_words(line: str, expected: str) -> None:
    assert match(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "nrtd[1]: [NMGR:kmgr_start_nn] Started NN: 10004",
        "Jan 08 21:53:19 ip-10-0-0-31 nrtd[4154]: [TDRV:reset_mla] Resetting 0000:00:10.0",
        "[2020-12-24 16:25:13,160] [WARNING] [runner.py:117:fetch_hostfile] Unable to find hostfile, will proceed",
        "2022-04-04 00:27:49.642404: E tensorflow/compiler/xla/xla_client/xla_util.cc:88] 0 derived errors ignored.",
        "  <NO_OTHER_FAILURES>",
        "srun: job 83 queued and waiting for resources",
        "[2024-03-12 08:22:56,574] torch.distributed.elastic.agent.server.api: [INFO] Local worker group finished "
        "(WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish",
    ],
)
def test_a_lookalike_of_the_level_and_frame_structures_is_not_fatal(line: str) -> None:
    assert match(line) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # a save verb in progress with what it saves (a checkpoint's parts too), or with where it goes
        ("Saving to /fsx/ubuntu/llama3_70B/pretrained_weight/model/dp_rank_00_tp_rank_00_pp_rank_00.pt", "start"),
        ("Writing optimizer shards to /ckpt/step-1200", "start"),
        # removing old checkpoints is no save: frameworks do it before one (diffusers, Accelerate) or after its end
        ("Removing old checkpoints [/ckpt/step-200]", None),
        ("Pruning checkpoint step-400 to keep 3", None),
        ("[1,0]<stderr>:INFO:tensorflow:Saving checkpoints for 0 into efficientdet-d1-finetune/model.ckpt.", "start"),
        ("Epoch 00002: val_acc improved from 0.39000 to 0.54000, saving model to /tmp/model.h5", "start"),
        ("Calling checkpoint listeners before saving checkpoint 0...", "start"),
        # the tense says it is done: after saving, saved with where it went, how long it took
        ("Calling checkpoint listeners after saving checkpoint 0...", "end"),
        ('2016-07-10 15:54:44,112 Node[0] Saved checkpoint to "model/dnn-0096.params"', "end"),
        ("Checkpoint upload took 41.2 s", None),  # a save verb is what tells a save's duration
        ("Writing snapshot took 12.3 seconds", "end"),
    ],
)
def test_a_save_is_read_by_its_verbs_tense_and_what_it_saves(line: str, expected: str | None) -> None:
    markers = {"start": log_patterns.CHECKPOINT_START, "end": log_patterns.CHECKPOINT_END, None: None}
    assert log_patterns.classify(line) == (None, markers[expected])
    # and the checkpoint filter keeps every marker
    assert expected is None or moto_logs_filter.keeps(log_patterns.CHECKPOINT_FILTER_PATTERN, line)


@pytest.mark.parametrize(
    "line",
    [
        "Trying to restore saved checkpoints from /vol/data ...  Checkpoint found: /vol/data/model.ckpt-1253",
        "INFO:tensorflow:Restoring parameters from output/model.ckpt-0",
        "INFO:tensorflow:Create CheckpointSaverHook.",
        "Pruning 30% of the weights of layer 3",  # pruning weights is training, not a checkpoint's part
        "Checkpoints will be saved every 500 steps to /out/ckpt",
        "WARNING:tensorflow:Can save best model only with val_loss available, skipping.",
        "| checkpoint 005 | epoch 005 | 0025035 updates | s/checkpnt     443 | words/s    7740 | lr 0.250000",
    ],
)
def test_a_line_about_a_checkpoint_that_is_no_save_is_no_marker(line: str) -> None:
    assert log_patterns.classify(line) == (None, None)


def test_reading_only_the_rules_a_lines_phrases_select_reads_it_as_every_rule_would() -> None:
    # Given every line of the corpus and the ordinary ones / When read by the rules their phrases of COVER select
    # Then the kind and marker are those of reading every rule in order (it skips only rules that cannot match)
    from corpus import real_lines

    def every_rule(message: str) -> tuple[str | None, str | None]:
        low = message.lower()
        everything = log_patterns._Candidates(log_patterns.RULES, log_patterns.MARKERS, may_fail=True)
        kind = log_patterns.BUILT_IN._match(message, low, everything)
        return kind, None if kind else log_patterns.BUILT_IN._marker(message, low, everything)

    lines = [r.text for r in real_lines.lines()] + [line for line, _ in FATAL_LINES] + BENIGN_LINES
    assert [log_patterns.classify(line) for line in lines] == [every_rule(line) for line in lines]


# --- the server-side filters, as CloudWatch Logs applies them ---------------------------------------------------------


@pytest.mark.parametrize("line", [line for line, _ in FATAL_LINES])
def test_the_fatal_filter_keeps_every_fatal_line(line: str) -> None:
    # Given a fatal line / Then the subscription filter's pattern (fatal lines alone) keeps it
    assert moto_logs_filter.keeps(log_patterns.FATAL_FILTER_PATTERN, line)
    assert log_patterns.notable(line)


@pytest.mark.parametrize("line", [line for line, _ in CHECKPOINT_LINES])
def test_the_checkpoint_filter_keeps_every_marker(line: str) -> None:
    assert moto_logs_filter.keeps(log_patterns.CHECKPOINT_FILTER_PATTERN, line)


@pytest.mark.parametrize("pattern", log_patterns.FILTER_PATTERNS, ids=["fatal", "checkpoint"])
def test_each_filter_pattern_is_one_regex_cloudwatch_takes(pattern: str) -> None:
    # FilterLogEvents and PutSubscriptionFilter take at most 1,024 characters, a regex of CloudWatch's subset
    assert len(pattern) <= log_patterns.FILTER_PATTERN_MAX
    assert pattern.startswith("%")
    assert pattern.endswith("%")
    assert pattern.count("%") == 2
    assert set(pattern[1:-1]) <= log_patterns.FILTER_REGEX_CHARS
    assert isinstance(moto_logs_filter.parse(pattern), moto_logs_filter.RegexFilter)


def test_the_python_twin_of_the_subscription_filter_is_cloudwatchs_reading() -> None:
    # Given the subscription filter with a deployment's own fatal line / Then its Python twin delivers what CloudWatch
    # would, and the built-in one leaves the user's line out
    pattern = log_patterns.fatal_filter_pattern(["Loss is NaN, giving up"])
    for line in ["step 9: Loss is NaN, giving up", "Killed", "step 9 loss 2.31"]:
        assert log_patterns.passes_fatal_filter(line, pattern) == moto_logs_filter.keeps(pattern, line)
    assert log_patterns.passes_fatal_filter("step 9: Loss is NaN, giving up", pattern)
    assert not log_patterns.passes_fatal_filter("step 9: Loss is NaN, giving up")


def test_the_fatal_filter_leaves_ordinary_lines_out() -> None:
    for line in ["step 120 loss 2.31 lr 3e-4", "Epoch 3:  45%|████▌ | 450/1000 [10:23<12:41,  1.39s/it]"]:
        assert not moto_logs_filter.keeps(log_patterns.FATAL_FILTER_PATTERN, line)


@pytest.mark.parametrize(
    ("python", "cloudwatch"),
    [
        ("Loss is NaN", "Loss.is.NaN"),
        (r"giving up after \d+ retries", r"giving.up.after.\d+.retries"),
        (r"\bOOM\b|oom\.kill", r"OOM|oom\.kill"),
        (r"rank \S+ lost \(heartbeat\)", "rank..+.lost..heartbeat."),
        ("[Ee]rror: it's over", "[Ee]rror:.it.s.over"),
    ],
)
def test_a_users_regex_is_widened_into_cloudwatchs_subset(python: str, cloudwatch: str) -> None:
    assert log_patterns.filter_regex(python) == cloudwatch
    assert set(cloudwatch) <= log_patterns.FILTER_REGEX_CHARS


@pytest.mark.parametrize("pattern", ["(foo|bar)", "foo(?=bar)", r"(a)\1"])
def test_a_regex_cloudwatch_cannot_hold_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="CloudWatch filter pattern"):
        log_patterns.filter_regex(pattern)


def test_a_policys_own_lines_name_lines_and_go_into_the_filters() -> None:
    # Given a deployment's own fatal line and checkpoint markers
    patterns = LinePatterns.extended(
        fatal=[r"Loss is NaN, giving up"], checkpoint_start=["snapshotting to"], checkpoint_end=["snapshot done"]
    )
    # Then they name lines, after the built-in kinds (a built-in line keeps its kind)
    assert patterns.match("step 9: Loss is NaN, giving up") == log_patterns.USER_FATAL
    assert patterns.match("Killed") == "killed"
    assert patterns.classify("snapshotting to /fsx/s1") == (None, log_patterns.CHECKPOINT_START)
    assert patterns.classify("snapshot done in 3 s") == (None, log_patterns.CHECKPOINT_END)
    assert log_patterns.classify("step 9: Loss is NaN, giving up") == (None, None)
    # And CloudWatch Logs returns them
    fatal, checkpoint = patterns.filter_patterns
    assert moto_logs_filter.keeps(fatal, "step 9: Loss is NaN, giving up")
    assert moto_logs_filter.keeps(checkpoint, "snapshotting to /fsx/s1")


def _unbounded_repeat_inside_repeat(parsed: sre_parse.SubPattern, inside: bool = False) -> bool:
    for op, av in parsed:
        if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            _, high, body = av
            unbounded = high == sre_constants.MAXREPEAT
            if (inside and unbounded) or _unbounded_repeat_inside_repeat(body, inside or unbounded):
                return True
        elif (op == sre_constants.SUBPATTERN and _unbounded_repeat_inside_repeat(av[-1], inside)) or (
            op == sre_constants.BRANCH and any(_unbounded_repeat_inside_repeat(b, inside) for b in av[1])
        ):
            return True
    return False


@pytest.mark.parametrize(
    "regex",
    [rule.regex for rule in log_patterns.RULES + log_patterns.MARKERS],
    ids=lambda p: p.pattern[:30],
)
def test_no_built_in_rule_nests_an_unbounded_repeat(regex: re.Pattern[str]) -> None:
    # The rules run on every tail line of hundreds of hosts: a nested unbounded repeat can backtrack exponentially
    assert not _unbounded_repeat_inside_repeat(sre_parse.parse(regex.pattern))


def _same_letter(av: list) -> bool:
    """A class of one letter in either case (`[Ss]`)."""
    letters = {chr(v).lower() for o, v in av if o == sre_constants.LITERAL}
    return len(letters) == 1 and all(o == sre_constants.LITERAL for o, _ in av)


def _texts(items: sre_parse.SubPattern) -> list[str]:
    """Every path through a sequence as its literal characters (lowercased), anything else (a wider class, a repeat,
    a lookaround) as a gap; a branch, inside a group or not, is one path per alternative."""
    paths = [""]
    for op, av in items:
        if op == sre_constants.LITERAL:
            parts = [chr(av)]
        elif op == sre_constants.IN and _same_letter(av):
            parts = [chr(av[0][1])]
        elif op == sre_constants.BRANCH:
            parts = [text for alt in av[1] for text in _texts(alt)]
        elif op == sre_constants.SUBPATTERN:
            parts = _texts(av[-1])
        else:
            parts = ["\0"]
        paths = [path + part.lower() for path in paths for part in parts]
    return paths


@pytest.mark.parametrize(
    "rule", log_patterns.RULES + log_patterns.MARKERS, ids=lambda r: f"{r.name}:{r.regex.pattern[:24]}"
)
def test_every_alternative_of_a_rule_holds_a_phrase_of_its_gate(rule: log_patterns.Rule) -> None:
    # The gate (a substring test on the lowercased line) skips the regex where it cannot match: never a line it would
    assert all(phrase == phrase.lower() for phrase in rule.gate)
    ungated = [text for text in _texts(sre_parse.parse(rule.regex.pattern)) if not any(p in text for p in rule.gate)]
    assert not ungated


def test_every_phrase_of_every_gate_holds_a_phrase_of_the_cover() -> None:
    # A line holding no phrase of COVER skips every rule: never one a gate would let through.
    phrases = {phrase for rule in log_patterns.RULES + log_patterns.MARKERS for phrase in rule.gate}
    assert not [p for p in phrases if not any(c in p for c in log_patterns.COVER)]
    assert all(c == c.lower() for c in log_patterns.COVER)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("Oct 30 19:13:39 ip-172-31-93-131 nrtd[1125]: [TDRV:io_queue] Unexpected input size", "neuron"),
        ("2022-04-04 00:27:49.642380: E tensorflow/compiler/xla/xla_client/xla_util.cc:88] error: no buffer", "xla"),
        ("[error] efa device lost on rdmap16s27", "efa"),
        ("ERROR: allocation failed, out of memory on device 3", "cuda_oom"),
        ("Failures:", "error"),  # no family named
        ("[MLA 0][NC 0] DMA TX engine 0 is in an abort state", "neuron"),  # a device's address frames it
        ("nd0 nc0 Timestamp program stop timeout (1000 ms)", "neuron"),
        ("Failed to initialize devices, error:5", "error"),  # a failure with the code it returned
    ],
)
def test_a_line_read_fatal_by_its_structure_is_named_by_the_family_its_words_name(line: str, expected: str) -> None:
    assert match(line) == expected


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("double free or corruption (!prev)", log_patterns.SIGABRT),  # glibc's malloc_printerr: the whole line
        ("*** Error in `python': free(): invalid pointer: 0x00000000024c6b10 ***", log_patterns.SIGABRT),
        ("free(): the pinned buffer pool holds 3 chunks", None),  # the function's name, not the catalogue's words
        ("system bytes     =     135168", None),  # malloc_stats: the process goes on
        ("[ip-10-0-1-17:12345] Failing at address: 0x10", log_patterns.MPI),  # opal's signal report
        (" # hg_core_init(): Could not initialize NA class (info_string=ofi+tcp, listen=1)", log_patterns.ERROR_LINE),
        (" # na_ofi_parse_hostname_info(): Could not find matching interface for ib0, attempting to use it as", None),
        ("[1733561480.223456789] ip-10-0-1-17:rank3.python: Reading ... failed. Disabling CMA support", None),
        ("[    6.402100] neuron 0000:00:1e.0: Warning: Can't allocate memory for neuron log", None),  # pci_warn
        ("[    6.402120] neuron 0000:00:1e.0: Can't enable the device", log_patterns.NEURON),
    ],
)
def test_runtime_aborts_and_their_lookalikes(line: str, kind: str | None) -> None:
    assert match(line) == kind


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # the EFA driver's admin queue stopped: the line after a command with no completion, in its PCI frame
        ("[  401.223344] efa 0000:00:06.0 rdmap16s27: Admin queue is closed", "efa"),
        ("[  401.223344] efa 0000:00:06.0 efa_0: Wait for completion (polling) timeout", "efa"),
        # the same words outside the driver's frame are no driver's
        ("Admin queue is closed", None),
        # its events it has no handler for, and the failed de-registration after a process ended, go on
        ("[  401.223344] efa 0000:00:06.0 efa_0: Completion event on non-existent CQ[7]", None),
        ("[  401.223344] efa 0000:00:06.0 efa_0: Failed to de-register mr(lkey-4242) [-22]", None),
        ("[  401.223344] efa 0000:00:06.0 efa_0: Failed to register mr [-12]", "efa"),
    ],
)
def test_the_efa_drivers_stopped_admin_queue_and_its_lookalikes(line: str, expected: str | None) -> None:
    assert match(line) == expected
    assert expected is None or moto_logs_filter.keeps(log_patterns.FATAL_FILTER_PATTERN, line)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        # aws-ofi-nccl's data path returning an error to NCCL, in words no failure vocabulary holds
        ("Received eager message for non-existent r_comm (7)", "efa"),
        ("Can not support more than 128 inflight requests", "efa"),
        ("No freelist items available", "efa"),
        # its WARNs that go on: a setting it turns on, a leak it reports at teardown
        ("CUDA flush enabled", None),
        ("ctrl freelist: there are 2 in-use entries that are not released", None),
        ("GDR disabled on GDR-supported instance type p5.48xlarge", None),
    ],
)
def test_the_network_plugins_warns_that_end_a_communicator(message: str, expected: str | None) -> None:
    assert match(f"ip-10-1-2-3:40211:40390 [3] fn:1 NCCL WARN NET/OFI {message}") == expected


@pytest.mark.parametrize(
    "line",
    [
        "libfabric:1:1::efa:cq:efa_rdm_pke_handle_handshake_recv():122<warn> Peer requested zero-copy receive via "
        "USER_RECV_QP which has been deprecated in newer Libfabric versions. Communication will continue.",
        "libfabric:1:1::efa:cq:efa_rdm_pke_handle_peer_error_recv():1059<warn> PEER_ERROR_PKT op_id=77 out of range "
        "or no longer valid; dropping.",
        "libfabric:1:1::efa:cq:efa_rdm_pke_handle_tx_error():534<warn> PEER_ERROR_PKT TX failed asynchronously "
        "prov_errno=4124 (Unresponsive receiver); deferring rxe release to drain. Sender's txe will leak.",
    ],
)
def test_a_libfabric_completion_warning_that_says_it_goes_on_is_benign(line: str) -> None:
    # Given libfabric's cq <warn> (its error level on the data path), saying the work goes on past it
    assert match(line) is None
    # while its cq <warn> that writes the error on is still read
    assert match("libfabric:1:1::efa:cq:efa_rdm_pke_handle_rtr_recv():129<warn> RMA address verification failed!")
