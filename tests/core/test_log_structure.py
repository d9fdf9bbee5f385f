"""A log line's structure (core/log_structure.py): the level each logging layout marks it with, the failure
vocabulary, the layouts that frame a line with no level."""

from __future__ import annotations

import pytest

from stallwatch.core import log_patterns, log_structure
from stallwatch.core.log_structure import ERROR, FATAL, LOW


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("2024-Jan-18 01:49:40.973725 39717:39897 ERROR  NMGR:kmgr_load_nn_post_metrics  Failed to load NN", ERROR),
        ("E0929 17:42:48.594192 1044529 coordination_service_agent.cc:332] Polled an error", ERROR),
        ("[E socket.cpp:957] [c10d] The client socket has timed out after 900s", ERROR),
        ("node-7:311:402 [2] NCCL WARN Net : Connection closed by remote peer", ERROR),  # the collectives' error level
        ("stdout:            ERROR    failed (exitcode: 1) local_rank: 1 (pid: 94477)      api.py:672", ERROR),  # rich
        ("slurmstepd: error: Exceeded step memory limit at some point.", ERROR),
        ("[NLA001]  Unhandled exception with message: === BIR error ===", ERROR),  # a compiler's error code
        ("F0423 12:34:56.789012 4242 device_manager.cc:88] Check failed: devices.size() == 8", FATAL),
        ("2026-01-05 10:11:12,123 - trainer - CRITICAL - giving up", FATAL),
        ("[2020-12-24 16:25:13,160] [WARNING] [runner.py:117:fetch_hostfile] Unable to find hostfile", LOW),
        ("INFO:root:retry budget left 2, last error ValueError: bad header", LOW),  # its leftmost mark, not the ERROR
        ("W0607 10:11:12.000000 4242 pjrt_client.cc:88] INTERNAL: RET_CHECK failure on a probe", LOW),
        ("[2022-03-25 16:41:50,060] [    INFO] - ***** Running Evaluation *****", LOW),  # PaddleNLP's padded level
        ("2: p5-dy-gpu-4:930643:930850 [7] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.13.2-aws", LOW),
        ("ERRO[0000] error waiting for container:", ERROR),  # logrus (docker, containerd)
        ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]]', ERROR),
        ("OFI error: fi_mr_reg(ofi_domain, memTab[i].addr): Cannot allocate memory", ERROR),  # a component's error
        # libfabric's warn is its error level on the data path, a probe's on setup (src/log.c's subsystems)
        (
            "libfabric:15409:1705531788::efa:mr:efa_mr_reg_impl():850<warn> Unable to register MR: Cannot allocate",
            ERROR,
        ),
        ("libfabric:462:1673041636:efa:core:rxr_info_to_rxr():506<warn> FI_HMEM capability requires RDMA", LOW),
        ("I20241209 23:39:42.495619 138559122262912 ProcessGroupNCCL.cpp:905] [PG ID 0] options", LOW),  # with a year
        (
            "nvidia-fabricmanager-start.sh[4756]: request failed with error:WARNING Nothing to do",
            None,
        ),  # a quoted status
        ('{"level":"error","ts":"2024-08-21T18:35:35Z","msg":"failed to reach the cluster agent"}', ERROR),  # zap
        ('{"level":"info","ts":"2024-08-21T18:35:35Z","details: ":{"severity":"warn"}}', LOW),  # the record's own key
        ("NCCL_DEBUG=INFO set by environment", None),  # a variable's value, not a level
        ("HYDRA_STYLE_ERROR=1 in the environment", None),  # a word holding ERROR is no mark
        ("Jan 08 21:53:19 ip-10-0-0-31 nrtd[4154]: [hal] request seq: 2, cmd: 1 timed out", None),
        # Ray's RAY_LOG(FATAL) is spdlog's critical, its letter C, read only behind its layout's milliseconds
        ("[2026-08-25 19:54:10,123 C 1044 1044] (raylet) worker_pool.cc:721: Too many workers", FATAL),
        ("[2026-08-25 19:54:10,123 I 1044 1044] (raylet) node_manager.cc:2875: Memory usage above threshold", LOW),
        ("grade C 1044 1044] of the survey", None),
    ],
)
def test_a_lines_level_is_the_leftmost_mark_of_its_layout(line: str, expected: str | None) -> None:
    assert log_structure.level(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "Jan 08 21:53:19 ip-10-0-0-31 nrtd[4154]: [hal] request seq: 2, cmd: 1 timed out",  # a daemon's syslog line
        "nrtd[1]: [NRTD:nrtd_main] Failed to initialize devices: 0000:00:1c.0 , attempt: 1",  # a component's tag
        "Failures:",  # a failure report's heading
        "Job 'raysubmit_7wNNGHdVi92R8wt2' failed",  # a subject's terminal state, last
        "[1,2]<stdout>: .. test-nccl-p5-2-worker-0 pid 75: Test failure common.cu:844",  # at a source location
        "[ 4730.855458] Aborting journal on device nvme0n1p1-8.",  # the kernel's ring buffer, a strong failure word
        "Job for nvidia-fabricmanager.service failed because the control process exited with error code.",  # a cause
        "mlx5: cn10: got completion with error:",  # a heading before a driver's dump
    ],
)
def test_a_line_with_no_level_is_fatal_when_a_frame_or_a_shape_holds_a_failure_word(line: str) -> None:
    assert log_structure.fatal_by_structure(line, line.lower())


@pytest.mark.parametrize(
    "line",
    [
        "nrtd[1]: [NMGR:kmgr_start_nn] Started NN: 10004",  # a daemon's line that says nothing failed
        "Jan 08 21:53:19 ip-10-0-0-31 nrtd[4154]: [TDRV:reset_mla] Resetting 0000:00:10.0",
        "[1,0]<stderr>:epoch 3 done",  # stderr holds err, not the word
        "Job 'raysubmit_7wN' has not failed",
        "3 checks passed, none failed so far: ok",
        "[2020-12-24 16:25:13,160] [WARNING] [runner.py:117:fetch_hostfile] Unable to find hostfile, will proceed",
        "[ERROR] First test message",  # an error mark that says nothing failed
        "[  +0.000005] pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0",  # corrected
        "[    8.020289] nvme nvme0: missing or invalid SUBNQN field.",  # a weak word in the kernel's frame
        "Validation error: 0.0512",  # a metric named error: a tool's error mark needs a failure word after it
    ],
)
def test_a_line_that_says_nothing_failed_or_is_marked_low_is_not(line: str) -> None:
    assert not log_structure.fatal_by_structure(line, line.lower())


def test_every_failure_word_holds_a_phrase_of_the_cover() -> None:
    # A line that may read as failed always holds a phrase of COVER, so the cover never lets it pass unread
    assert all(any(c in hint for c in log_patterns.COVER) for hint in log_structure.FAILURE_HINTS)


@pytest.mark.parametrize(
    ("line", "fatal"),
    [
        ("[    5.481012] NVRM: No NVIDIA GPU found.", True),  # the driver's tag: a runtime that cannot start
        ("[    5.481030] NVRM: None of the NVIDIA devices were initialized.", True),
        ("NRT:nrt_init      This runtime requires Neuron Driver version 2.0 or greater. Please upgrade ...", True),
        ("[    0.412345] ACPI: No dock devices found.", False),  # a healthy boot: the kernel's frame, no device runtime
        ("[    5.470030] NVRM: BAR resize resource not supported.", False),  # a warning, no device said missing
        ("2023-Jan-26 00:25:02.0183  4057:4131   INFO  TDRV:pool_stdio  No neuron device available", False),  # INFO
    ],
)
def test_a_device_runtimes_refusal_to_start_is_fatal_only_in_its_own_frame(line: str, fatal: bool) -> None:
    assert log_structure.fatal_by_structure(line, line.lower()) is fatal


@pytest.mark.parametrize(
    ("line", "fatal"),
    [
        ("[1733561480.123456789] ip-10-0-1-17:rank0.python: Unable to initialize verbs NIC rocep0s6 (unit 0:1)", True),
        ("NRT:nrt_init      Unable to determine Neuron Driver version.", True),  # the runtime's frame, no level
        ("E0000 00:00:1723141151.233718 5214 cuda_dnn.cc:8310] Unable to register cuDNN factory: ...", False),
        ("Unable to find hostfile, will proceed with training with local resources only.", False),  # no frame
    ],
)
def test_unable_is_a_failure_only_in_a_components_frame_with_no_level(line: str, fatal: bool) -> None:
    assert log_structure.fatal_by_structure(line, line.lower()) is fatal


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[NeMo E 2024-11-05 17:42:10 nlp_overrides:1192] Error: Missing keys when loading state dictionary", "error"),
        ("[NeMo C 2024-11-05 17:42:10 exp_manager:12] boom", "fatal"),
        ("[NeMo W 2024-11-05 17:42:10 exp_manager:569] checkpointing will not error out", "low"),
        ("[NeMo I 2024-11-05 17:42:10 exp_manager:400] Experiments will be logged at /results", "low"),
    ],
)
def test_nemos_layout_marks_its_level_after_its_tag(line: str, expected: str) -> None:
    assert log_structure.level(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # dmlc's one layout for every level; its LogMessageFatal logs its message through LOG(ERROR) at logging.h
        ("[19:54:10] ./include/dmlc/logging.h:276: [19:54:10] src/van.cc:101: unsupported van type: foo", "fatal"),
        ("[19:54:10] src/./rdma_van.h:898: OnDisconnected from Node 9", None),
    ],
)
def test_dmlcs_fatal_is_its_relog_at_its_own_header(line: str, expected: str | None) -> None:
    assert log_structure.level(line) == expected


@pytest.mark.parametrize(
    ("line", "fatal"),
    [
        # rdma-core's verbs log (`device: function:line: `): its failures are framed, its notices are not failures
        ("rdmap16s27: efa_create_qp:2265: Failed to create QP", True),
        ("rdmap16s27: efadv_query_device:172: Not an EFA device", False),
        # a sentence with a colon is no such frame
        ("note: training goes on: step 12 failed to log, see above", False),
    ],
)
def test_rdma_cores_verbs_log_frames_its_failures(line: str, fatal: bool) -> None:
    assert log_structure.fatal_by_structure(line, line.lower()) is fatal
