"""A log line's structure, read before its words name a family: the severity its logging layout marks it with, whether
it says something failed (a closed vocabulary of failure verbs and states), and the layouts that frame a line with no
level. `log_patterns` decides with these, then names the line by its family.

    level("E0929 17:42:48.594192 1044529 coordination_service_agent.cc:332] Polled an error")  # "error"
    level("[2020-12-24 16:25:13,160] [WARNING] [runner.py:117:fetch_hostfile] Unable to find hostfile")  # "low"
    line = "Oct 30 19:13:39 ip-1 nrtd[1125]: [TDRV:io_queue] Unexpected input size"
    fatal_by_structure(line, line.lower())  # True

Every regex here is linear in the line (bounded repeats, no nested unbounded ones): they run on the tail lines of
hundreds of hosts, though only on the few lines holding a failure word.
"""

from __future__ import annotations

import re

FATAL = "fatal"
ERROR = "error"
LOW = "low"  # warning, info, debug: the levels frameworks log the errors they catch at

# Each logging layout's severity marks; the leftmost on a line is its level (the layout's prefix, not a word its
# message quotes). Words: the collectives' WARN (NCCL's and the Neuron collectives' only level for errors), logging's
# ERROR, FATAL and CRITICAL (Python's, the Neuron runtime's `ERROR  NRT:`, SageMaker's toolkit, rich consoles) and its
# low levels (WARNING, INFO, DEBUG: `[    INFO]`, `| INFO |`, `INFO:root:`, not `NCCL_DEBUG=INFO` nor a status a
# message quotes after a colon, `failed with error:WARNING`). Brackets: spdlog's lowercase ones, logrus's `ERRO[0000]`
# (docker's, containerd's), libfabric's `<warn>` (below), `<info>`, `<trace>`, a tool's `: error: `. Leading the line:
# a tool's or a component's error (`error:`, `docker: Error response`, `OFI error:`, `nvidia-container-cli:
# initialization error:`), an application's `Fatal:`, a compiler's error code (neuronx-cc's `[F134]`,
# `[NCC_EVRF035]`). glog's and absl's letters after a space, a bracket, a colon or the line's start: `E0929 17:42:48`,
# `I20241209 23:39:42` (with the year), PyTorch's `[E socket.cpp:957]`, TensorFlow's `E tensorflow/...cc:706]`,
# Ray's `E 1234 5678]` (its FATAL is `C 1234 5678]`). A JSON record's `"level":"error"`. Each regex opens with a
# literal or a class, so it scans fast.
# UCX's DIAG, its level between WARN and INFO (ucs/debug/log.c), is a low one too.
_WORD_MARK = re.compile(r"(?:(?:NCCL|CCOM) WARN|ERROR|FATAL|CRITICAL|WARN(?:ING)?|DIAG|INFO|DEBUG)\b")
_WORD_LEVELS = {"ERROR": ERROR, "FATAL": FATAL, "CRITICAL": FATAL}  # the collectives' WARN is an error; the rest low
_LOW_BEFORE = frozenset(" \t[|(")  # what a low level's word follows
_LOW_AFTER = frozenset(" \t]|:)")  # and is followed by
_BRACKET_MARK = re.compile(
    r"\[(?:error|critical|warning|info|debug)\]|<(?:warn|trace|info|debug)>|: error: |Fatal error\b"
    r"|\b(?:ERRO|FATA|PANI|WARN|INFO|DEBU)\[\d"
)
_BRACKET_LEVELS = {
    "[error]": ERROR, ": error: ": ERROR, "ERRO[": ERROR, "[critical]": FATAL, "Fatal error": FATAL, "FATA[": FATAL,
    "PANI[": FATAL,
}  # fmt: skip
# libfabric's levels are warn, trace, info and debug (src/log.c): its `<warn>` is its error level where the data path
# reports (the subsystems mr, cq, eq, av, ep_data, ep_ctrl: a registration, a completion, an event that failed) and
# where a provider opens its fabric and domain (fabric, domain), except in the functions that probe (their names say
# info, check or layering), and a setup probe's in core, where providers and capabilities are weighed (another
# provider is tried).
_LIBFABRIC_DATA_PATH = re.compile(
    r"\blibfabric:[^<\n]{0,200}?:(?:(?:mr|cq|eq|av|ep_data|ep_ctrl):"
    r"|(?:fabric|domain):(?!\w{0,80}?(?:info|check|layering)))\w{1,80}\(\):\d{1,6}<warn>"
)
# libfabric's own frame at a low level (`libfabric:pid:time::efa:cq:func():line<info> `): what its provider reports
# there (a completion error it hands to the application, a QP it retries, a counter it cannot query) it goes on past;
# its errors are at `<warn>`.
_LIBFABRIC_LOW = re.compile(r"\blibfabric:[^<\n]{0,200}?\(\):\d{1,6}<(?:info|trace|debug)> ")
# The leading mark may follow indentation and up to two bracketed prefixes (a log file's timestamp, Slurm's
# `[jobid.step]`), and before `Fatal: ` the source location that raised it (UCX's ucs_fatal, `[host:pid:thread:tid]
#   ucp_ep.c:4809 Fatal: ...`: its ucs_log_fatal_error prefix, then `%13s:%-4u`).
_LEADING_MARK = re.compile(
    r"\s{0,8}(?:\[[^\]\n]{1,40}\] ){0,2}(?:\s{0,16}[\w.-]{1,60}\.c\w{0,2}:\d{1,6} {1,4}(?=Fatal: ))?"
    r"(?:Fatal: |\[(?:NCC_)?[A-Z]{1,5}\d{3}\] "
    r"|(?:[\w./-]{1,40}:? )?(?:[A-Za-z]{2,20} )?(?:error|Error)(?=: | response\b))"
)
_GLOG_MARK = re.compile(
    r"[EFIW](?:(?:\d{8}|\d{3,4}) \d\d:\d\d:\d\d| [^\s\]]{1,200}\.(?:cc|cpp|cu|h|hpp|c|py):\d{1,6}\]"
    r"| \d{1,8} \d{1,8}\])"
    # Ray's C++ layout, "[%Y-%m-%d %H:%M:%S,%e %L %P %t]": its RAY_LOG(FATAL) is spdlog's critical level, letter C
    # (src/ray/util/logging.cc), read only behind the layout's milliseconds
    r"|C(?<=\d,\d{3} C)(?= \d{1,8} \d{1,8}\])"
)
_GLOG_BEFORE = frozenset(" \t[]:(")
# Ray's raylet spilling, restoring and deleting objects (src/ray/raylet/local_object_manager.cc): a request to its IO
# workers that failed is logged at E and the objects go back to be spilled or restored again (the pull manager retries
# a restore; its own fatal is a RAY_CHECK, at C), so its E behind Ray's layout is a low level.
_RAY_RETRIED = re.compile(r" (?:\([\w-]{1,40}\) )?local_object_manager\.cc:\d{1,6}: ")
# A structured (JSON) line's level key, as zap, logrus, structlog and python-json-logger write it: the first such key
# is the record's own (a nested event's `"severity":"warn"` comes after it).
_JSON_MARK = re.compile(
    r'"(?:level|severity|lvl|levelname)": ?"(?i:(error|err|fatal|critical|panic|warn|warning|info|debug|trace))"'
)
_JSON_LEVELS = {"error": ERROR, "err": ERROR, "fatal": FATAL, "critical": FATAL, "panic": FATAL}
# logrus's text formatter and logfmt (dockerd's and containerd's journal lines: `time="..." level=error msg="..."`):
# the record's own level key, before its message.
_LOGFMT_MARK = re.compile(r"(?:^|\s)level=(error|fatal|panic|warning|warn|info|debug|trace)\b")
# A level's initial before the record's date and time in brackets: NeMo's formatter (nemo/utils/formatters/base.py,
# the logging of NeMo and of NxD Training, which logs through it), `[NeMo E 2024-11-05 17:42:10 module:line] `, and
# Optuna's default handler (optuna/logging.py, `[%(levelname)1.1s %(asctime)s]` from v0.x on, colorlog's colour code
# before it where its formatter adds one), `[W 2024-11-05 17:42:10,294] `: C for CRITICAL.
_INITIAL_MARK = re.compile(r"\[(?:NeMo )?([DIWEC]) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_INITIAL_LEVELS = {"E": ERROR, "C": FATAL}
# dmlc's light logger (include/dmlc/logging.h, ps-lite's and BytePS's servers' and vans' logging): one layout for
# every level, `[HH:MM:SS] file:line: `; its LogMessageFatal (LOG(FATAL), CHECK) logs its own message through
# LOG(ERROR) at dmlc/logging.h before it throws dmlc::Error, so a line in that layout at dmlc/logging.h holding a
# second one is a fatal's
_DMLC_FATAL = re.compile(r"\[\d\d:\d\d:\d\d\] [^\s\]]{0,200}dmlc/logging\.h:\d{1,6}: \[\d\d:\d\d:\d\d\] ")
_GLOG_LEVELS = {"E": ERROR, "F": FATAL, "C": FATAL}  # I and W are low; C is Ray's FATAL
# NCCL's frame before 2.3 (its closed 2.0-2.2 releases), `host:pid:tid [dev] file:line WARN `: no `NCCL ` before the
# level, which 2.3.5's src/include/debug.h and every later debug.cc print (`... file:line NCCL WARN `); its WARN is its
# error level there too. Read from the pid on (a host's name may end in digits); its INFO stays low.
NCCL_FRAME = r":\d{1,9}:\d{1,9} \[\d{1,3}\] [\w./-]{1,120}:\d{1,6} WARN "
_NCCL_FRAME = re.compile(NCCL_FRAME)

# What a line says went wrong: a closed vocabulary of failure verbs and states, as substrings of the lowercased line,
# and the words a longer word may hold (skill, deadline, room, stderr), read on their boundaries and in their cases
# (`err` of error, errno, `err: 10`; not a level's ERROR). Each is, or holds, a phrase of `log_patterns.COVER`, so a
# line that may read as failed is never one the cover lets pass unread.
_FAILURE_WORDS = (
    "fail", "abort", "terminat", "crash", "timed out", "timed-out", "timeout", "exhaust", "exception", "fatal", "panic",
    "invalid", "refused", "unexpected", "cannot", "can't", "could not", "couldn't", "not found", "out of memory",
    "not retrying",  # a retry given up (Spark's TaskSetManager: `...; not retrying`, then it aborts the job)
)  # fmt: skip
# A deadlock is a death too (Horovod's stall inspector at E, `... which will cause deadlock.`, before it shuts down);
# at an error mark (its `err` a hint), a driver that says it stops (Horovod's elastic driver, `ERROR:root:reset count 3
# has exceeded limit 3 -> stop running`: registration.py, then driver.stop()).
_BOUNDED_FAILURE = re.compile(
    r"\b(?:[Kk]ill|[Dd]ied\b|[Dd]ead(?:lock)?\b|[Ll]ost\b|OOM\b|oom\b|[Ee]rr|[Ss]top(?:ping)? running\b)"
)
_FAILOVER = re.compile(r"fail[- ]?over")
_BOUNDED_HINTS = ("kill", "died", "dead", "lost", "oom", "err")
# A device's runtime or driver refusing to start, in words no failure vocabulary holds: no device of its kind (the
# Neuron runtime's `No neuron device available`, NVRM's `No NVIDIA GPU found.`, `None of the NVIDIA devices were
# initialized.`), a device that is not one of its kind (`BDF 0000:00:1c.0 is not a MLA Device`), a version of what it
# needs below the one it requires (`This runtime requires Neuron Driver version 2.0 or greater`), no network interface
# the collectives can bootstrap on (their `CCOM WARN No usable listening interface found`, nrt-troubleshoot's "Failure
# to find bootstrap interface"). Its runtime exits: the job cannot run. Read only in a component's frame, the NVIDIA
# driver's `NVRM: ` tag or the collectives' WARN (their error level), on lines naming the Neuron runtime's components,
# its collectives or NVRM as they print them (the hints; the subscription filter keeps those names), so a healthy
# boot's `ACPI: No dock devices found` is never one.
_REFUSED = re.compile(
    r"\b(?:[Nn]o|NO|[Nn]one of the) (?:[\w-]{1,30} ){0,3}?(?i:devices?|gpus?|adapters?|interfaces?)\b"
    r"|\bnot an? (?:[\w-]{1,30} ){0,2}?(?i:device|gpu|adapter)\b"
    r"|\brequires [^\n]{0,60}?\bversion [\d.]{1,20} or (?:greater|newer|later|higher)\b"
)
_REFUSAL_HINTS = ("nrt", "tdrv", "nmgr", "kmgr", "nvrm", "ccom")
_REFUSAL_FRAMES = re.compile(r"NRT|TDRV|[NK]MGR|NVRM|CCOM WARN")  # as they print them (the subscription filter keeps)
_DRIVER_TAG = re.compile(r"\bNVRM: ")
# `unable` says a call failed only where no level marks the line and a component frames it (PSM3's `Unable to
# initialize verbs NIC`, the Neuron runtime's `NRT:nrt_init  Unable to determine ...`): an error-marked one is often
# a probe that goes on (TensorFlow's `E ... Unable to register cuDNN factory`, NCCL's IB discovery).
_FRAMED_HINTS = ("unable",)
FAILURE_HINTS = _FAILURE_WORDS + _BOUNDED_HINTS + _REFUSAL_HINTS + _FRAMED_HINTS

# Layouts with no level that frame a line as a component's own: a daemon's syslog line (`nrtd[1125]: `, as journald
# and /var/log/syslog write it), a component's bracketed tag (the Neuron runtime's `[TDRV:reset_mla]`), a frame of
# MPICH's error stack (`find_provider(170).....: `, printed only when a call fails), the device and core the Neuron
# runtime addresses a line to (`[ND 0][NC 4] `, `[MLA 0][NC 0] `, `nd0 nc0 `: its hardware and timeout reports), a
# Ray task or actor method as Ray names the one a failure came from (`ray::EnvWorker.interact() (pid=650823, ...`).
# The Neuron runtime's `COMPONENT:function` with its padding and no level (`NRT:nrt_init      Unable to ...`): its
# console shows ERROR alone by default (NEURON_RT_LOG_LEVEL), and its documentation quotes its start-up failures so.
# Mercury's (NA's, HG's) error macros' second line, `# function(): message` (` # `, or `## ` in its coloured layout),
# the level on the line before it: its CHECK_ERROR macros print it, and a few warnings that say they go on. PSM3's
# (libfabric's psm3 provider) `[seconds.nanoseconds] host:rankN.program: `, the layout of its _HFI_ERROR (its
# _HFI_INFO and debug lines print only under PSM3_TRACEMASK). rdma-core's providers' verbs log, `device: func:line: `
# (libibverbs' verbs_log, written only to VERBS_LOG_FILE when VERBS_LOG_LEVEL asks: its ERR and WARN share the layout).
_COMPONENT = re.compile(
    r"\b[\w.-]{1,40}\[\d{1,9}\]: |\[[A-Z][A-Z0-9_]{1,15}:\w{1,80}\] |(?:^|\s)[A-Za-z_]\w{0,80}\(\d{1,6}\)\.*: "
    r"|\[(?:ND|MLA) \d{1,3}\]\[NC \d{1,3}\] |(?:^|\s)nd\d{1,3} nc\d{1,3} |\bray::[\w.]{1,120}\(\) \(pid=\d"
    r"|(?:^|\s)[A-Z]{2,5}: ?[a-z]\w{0,40}_\w{1,80} {2}|(?:^|\s)#{1,2} \w{1,80}\(\): "
    r"|^\[\d{9,10}\.\d{9}\] [\w.-]{1,80}:(?:rank|pid)\d{1,9}\.[\w.-]{1,80}: "
    r"|^[a-z][\w-]{1,30}: [a-z_]\w{1,80}:\d{1,6}: "
    # a recipe's job runner in its own name (Kaldi's run.pl, queue.pl, slurm.pl, as ESPnet's recipes run them: `run.pl:
    # job failed, log is in ...`, then exit 1), ESPnet's recipe scripts' log() frame (`(asr.sh:312:main) `: its errors
    # are each followed by `exit 2`), Megatron's rerun state machine addressing a rank and iteration (log_failure's
    # `Rank 3, node n, device 3, iteration #1001: `, its `Unexpected result nan on rank 3 at iteration #1001`: the run
    # then exits to be resumed; RERUN_DISABLED's non-fatal warning names the iteration with no `#`)
    r"|^[\w-]{1,40}\.(?:pl|sh): |\([\w.-]{1,60}\.sh:\d{1,6}:\w{1,80}\) "
    r"|\b[Rr]ank \d{1,6}, node [\w.-]{1,80}, device \d{1,3}, iteration #\d|\bon rank \d{1,6} at iteration #\d"
)
# The kernel's ring buffer (dmesg's `[ 4730.850402] `, its readable `-T` date `[Mon Jan  2 10:41:37 2024] ` and its
# `-e` forms `[Feb14 05:03] ` and `[  +0.000316] `, syslog's `kernel: `): its drivers log no level a reader keeps, and
# print both failures and the notices of a healthy boot, so only the strong failure words count there, and not when
# the line calls the error corrected or non-fatal (a PCIe AER's corrected error, a recovered one).
_KERNEL = re.compile(
    r"^\s{0,4}\[(?:\s{0,12}\+?\d{1,10}\.\d{3,9}|[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    r"|[A-Z][a-z]{2}[ \d]\d \d\d:\d\d)\] |\bkernel: "
)
_KERNEL_FAILURE = re.compile(r"\b(?i:error|fail(?:ed|ure|s)?|abort\w{0,3}|panic|crash(?:ed)?|cannot|can't|unable)\b")
# The Neuron driver's own frame in the ring buffer (its pr_fmt, `neuron:function: `) adds the waits it gives up on and
# the work it could not do (`DMA completion timeout on nd00 for UDMA_ENG_33 q0`, `could not pin host pages`): each
# returns an error to the runtime's ioctl (aws-neuron-driver neuron_dma.c, neuron_ring.c).
_NEURON_DRIVER_FAILURE = re.compile(r"\bneuron:[a-z]\w{1,80}: [^\n]{0,200}?\b(?i:timeout|could not)\b")
# EFA's DEREG_MR failing after a process ended: the driver freed the buffers first (the Neuron docs call it benign),
# and the EFA driver's own line for the same failed de-registration (`Failed to de-register mr(lkey-N) [-22]`).
# A driver's line that calls itself a warning (`pci_warn(dev, "Warning: ...")`): its probe goes on.
# The kernel's reports of what it handled and goes on past: ACPICA's interpreter messages (`ACPI BIOS Error (bug): `,
# `ACPI Error: Aborting method ...`: a control method given up, utxferror.c) and FW_BUG's `[Firmware Bug]: `, EDAC's
# corrected count (`EDAC MC0: 1 CE memory read error`, edac_mc.c), AER's register dump after its heading (`error
# status/mask=`, aer.c), APEI's tables set up (`ERST: Error Record Serialization Table (ERST) support is initialized.`)
# and the records of a previous boot (`BERT: Error records from previous boot:`), mce's count of logged events. The
# NVLink core library's reports behind its `nvidia-nvlink: ` tag (nvlink_linux.c prints every level so): a link it
# marks failed in training is left out and the rest go on (nvlink_initialize.c); a link that stops the GPU is an Xid.
_RECOVERED = re.compile(
    r"\b(?i:correct(?:ed|able)|non-?fatal|recovered)\b|\bDEREG_MR\b|\bde-register mr\b|\b[Ww]arning: |\bnvidia-nvlink: "
    r"|\bACPI(?: BIOS)? (?:Error|Warning|Exception)\b|\[Firmware (?:Bug|Warn|Info)\]|\b\d{1,10} CE\b"
    r"|\berror status/mask=|\bis initiali[sz]ed\b|\bprevious boot\b|\bevents logged\b"
)
# Shapes that say something failed with no level and no component: a failure report's heading (a short line ending in
# a colon that names failures or errors: torchrun's `Failures:`, a driver's `got completion with error:` before its
# dump), a subject's terminal state as the line's last word (`Job 'raysubmit_7wN' failed`) or an exclamation
# (bitsandbytes 0.41's `CUDA SETUP: CUDA detection failed! Possible reasons:`, before `Setup Failed!`), with its cause
# (systemd's `Job for x.service failed because ...`) or its circumstance (bitsandbytes 0.39-0.43's raised `CUDA Setup
# failed despite GPU being available.`), a job a scheduler gives up on (submitit's `Job not requeued because:
# timed-out`), a failure pointing at a source location (`Test failure common.cu:844`), a failure with the error code it
# returned (the Neuron runtime's `Failed to initialize devices, error:5`, Sample Factory's launcher's `Failed processes:
# PID: 4321 code: 1`, bitsandbytes' `Device API failed with status 1: invalid argument`, then a throw).
_UNLEVELLED_FAILURE = re.compile(
    r"^\s{0,8}[^\n]{0,80}?\b(?i:failures?|errors?)\b[^:\n]{0,60}:\s*$"
    r"|(?<!\bnot )(?<!\bnever )\b(?:failed|FAILED|Failed|aborted|crashed|died)(?:[.!]?\s*$|! )"
    r"|\b(?:failed|aborted|terminated|crashed|died|shut ?down) (?:because|despite)\b"
    # a component said shut down with its cause (Horovod's SHUT_DOWN_ERROR status, `Horovod has been shut down. This
    # was caused by an exception on one of the ranks ...`), a launcher ending the rest after one failed (horovodrun's
    # gloo_run.py: `Terminating remaining workers after failure of Process 1.`)
    r"|\b(?:has|have) been shut ?down\b|\b(?:Terminating|Killing|Stopping) (?:all )?(?:the )?(?:remaining|other) "
    r"\w{1,30} (?:after|because|due to)\b"
    r"|\b(?:[Jj]ob|[Tt]ask|[Ss]tep|[Ww]orker) (?:was |will )?not (?:be )?(?:requeued|restarted|resumed|retried)\b"
    r"|\b(?i:fail(?:ed|ure)?|error)\b[^\n]{0,40}?\b[\w./-]{1,120}\.(?:c|cc|cpp|cu|h|hpp|py):\d{1,6}\b"
    # or at `line N in file F` (bitsandbytes' CUDA_CHECK_RETURN, csrc/ops.cuh: `Error %s at line %d in file %s`, then
    # exit(1))
    r"|\b(?i:fail(?:ed|ure)?|error)\b[^\n]{0,120}?\bat line \d{1,6} in file \S{1,200}\.(?:c|cc|cpp|cuh?|h|hpp|py)\b"
    r"|\b(?i:fail(?:ed|ure)?)\b[^\n]{0,120}?\b(?:error|err|status|code|rc|ret)(?:[:=] ?| )-?[1-9]"
    # the dynamic loader's failure (dlerror), a library that could not be loaded: an optional one's probe is logged at
    # a low level or says it falls back (bitsandbytes' `Could not load bitsandbytes native library: libcusparse.so.11:
    # cannot open shared object file: ...`: no native library, its first call fails)
    r"|\.so(?:\.\d{1,4}){0,4}: cannot open shared object file\b"
    r"|\b[Ww]ill now (?:abort|terminate)\b"  # a process announcing its own end (libfabric's "will now abort()")
    r"|\b(?:cannot|can't) (?:proceed|continue)\b"  # or that it cannot go on (libfabric efa's receive-window banner)
    # or ending its sentence with it (Sample Factory's runner: `Components take too long to start: ... Aborting the
    # experiment!`, its 1.x rollout worker: `Terminate process...`), bare after what it gives up on or with its cause
    # (1.x's sampler: `Process 3 had not responded in 600.4 s!!! Terminating...`, `Terminating due to process 3
    # crashing...`)
    r"|(?:^|\] |[.!] )(?:Abort(?:ing)?|Terminat(?:e|ing))(?: (?:the |this )?"
    r"(?:process|program|experiment|training|run|job)| due to [^\n]{1,80}?)?(?:\.{1,3}|!)?\s*$"
    # an exception no handler took, or one caught at the top of a loop or a worker, whose process then stops (Sample
    # Factory's runner `Uncaught exception in Runner_EvtLoop evt loop`, 1.x's `Exception in driver loop` and `Unknown
    # exception in rollout worker`, signal_slot's event loop `unhandled exception in slot=...`, which re-raises)
    r"|\b(?:[Uu]ncaught|[Uu]nhandled|[Uu]nknown) exception\b|(?:^|\] )Exception in (?:the )?[\w-]{1,40} loop\b"
)
# A failure a line only foretells, after a modal (NeMo's exp_manager at ERROR: `Please note that this is not tested in
# NeMo and could result in errors.`, `It is very likely this run will fail with ModelCheckpoint(monitor=...) not
# found ...`): the run goes on; its sentence is read without it.
_HYPOTHETICAL = re.compile(
    r"\b(?:could|may|might|(?:is|are) (?:very )?likely (?:that )?[\w ]{1,40}? will) (?!not\b)"
    r"(?:\w{1,20} ){0,2}?(?:result in|cause|lead to|fail)\b[^.\n]{0,200}"
    # or only guesses at a cause (XLA's conv autotuner at E, conv_algorithm_picker.cc: `Results mismatch between
    # different convolution algorithms. This is likely a bug/unexpected loss of precision in cudnn.`: it marks the
    # algorithm WRONG_RESULT and picks another)
    r"|\b(?:is|are) (?:very |most )?likely (?:a|an) [^.\n]{1,200}"
)
# A platform probe's failure, logged and not raised: a driver's initialiser at the error level of a framework that
# probes platforms (XLA's stream executor, cuda_driver.cc: `failed call to cuInit: CUDA_ERROR_NO_DEVICE ...`; later
# cuda_platform.cc's `failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: ...` and its `could not
# retrieve CUDA device count: ...`, which counts no device), the diagnostician's report after it (cuda_diagnostics.cc's
# `kernel version ... does not match DSO version ...`), JAX's backend initialisation (xla_bridge.py: a backend that
# fails quietly, `Unable to initialize backend 'cuda': ...` at INFO and `CUDA backend failed to initialize: ...` at
# WARNING, then the CPU), and fi_info's report that no provider matched (util/info.c, `fi_getinfo: -61 (...)`, the
# whole line): the platform is left uninitialised and the client goes on with another; its own calls' failures are
# what end a run. Raised, behind an exception's name (JAX's `RuntimeError: Unable to initialize backend ...` for a
# platform JAX_PLATFORMS names, `XlaRuntimeError: INTERNAL: ...`), it is that exception's.
_PROBE = re.compile(
    r"\bfailed call to cu(?:Init|DriverGetVersion)\b|\bcould not retrieve CUDA device count\b"
    r"|\bkernel version \S{1,40} does not match DSO version\b"
    r"|\bUnable to initialize backend '|\b\w{1,10} backend failed to initialize\b"
    r"|^\s{0,8}fi_getinfo: -\d{1,4}(?: \(|\s*$)"
)
_PROBE_HINTS = ("cuinit", "cudrivergetversion", "device count", "dso version", "backend", "fi_getinfo")
_RAISED = re.compile(r"\b[A-Z]\w{0,60}(?:Error|Exception): ")
# The error code a component's leading `error:` gives before its text (`EFA internal error: (4124) Unresponsive
# receiver`): the code says what failed where the text names no failure word.
_LEAD_CODE = re.compile(r":\s{1,4}\(-?\d{1,6}\) ")
# A side channel's own errors (the experiment tracker's uploads) never stop training; its fatal ones raise exceptions.
_SIDE_CHANNEL = "wandb: "


def level(message: str) -> str | None:
    """The severity the line's layout marks it with (FATAL, ERROR, LOW), or None for a line with no mark."""
    lead = _LEADING_MARK.match(message)
    if lead is not None:
        return FATAL if lead.group().endswith("Fatal: ") else ERROR
    marks = [
        mark
        for mark in (
            _word_mark(message),
            _bracket_mark(message),
            _glog_mark(message),
            _json_mark(message),
            _logfmt_mark(message),
            _initial_mark(message),
            _dmlc_mark(message),
            _nccl_mark(message),
        )
        if mark
    ]
    return min(marks)[1] if marks else None


def _word_mark(message: str) -> tuple[int, str] | None:
    for found in _WORD_MARK.finditer(message):
        start, end, word = found.start(), found.end(), found.group()
        before = message[start - 1] if start else " "
        if word.endswith(" WARN") or word in _WORD_LEVELS:
            if not (before.isalnum() or before == "_"):
                return start, _WORD_LEVELS.get(word, ERROR)
        elif before in _LOW_BEFORE and (end == len(message) or message[end] in _LOW_AFTER):
            return start, LOW
    return None


def _bracket_mark(message: str) -> tuple[int, str] | None:
    found = _BRACKET_MARK.search(message)
    if found is None:
        return None
    mark = found.group()
    if mark == "<warn>" and _LIBFABRIC_DATA_PATH.search(message) is not None:
        return found.start(), ERROR
    return found.start(), _BRACKET_LEVELS.get(mark.rstrip("0123456789"), LOW)


def _json_mark(message: str) -> tuple[int, str] | None:
    if '"' not in message:
        return None
    found = _JSON_MARK.search(message)
    return (found.start(), _JSON_LEVELS.get(found.group(1).lower(), LOW)) if found else None


def _logfmt_mark(message: str) -> tuple[int, str] | None:
    if "level=" not in message:
        return None
    found = _LOGFMT_MARK.search(message)
    return (found.start(), _JSON_LEVELS.get(found.group(1), LOW)) if found else None


def _initial_mark(message: str) -> tuple[int, str] | None:
    if "[" not in message:
        return None
    found = _INITIAL_MARK.search(message)
    return (found.start(), _INITIAL_LEVELS.get(found.group(1), LOW)) if found else None


def _dmlc_mark(message: str) -> tuple[int, str] | None:
    if "dmlc/logging.h:" not in message:
        return None
    found = _DMLC_FATAL.search(message)
    return (found.start(), FATAL) if found else None


def _nccl_mark(message: str) -> tuple[int, str] | None:
    if " WARN " not in message:
        return None
    found = _NCCL_FRAME.search(message)
    return (found.start(), ERROR) if found else None


def _glog_mark(message: str) -> tuple[int, str] | None:
    for found in _GLOG_MARK.finditer(message):
        start = found.start()
        if start == 0 or message[start - 1] in _GLOG_BEFORE:
            if message[start] == "E" and _RAY_RETRIED.match(message, found.end()):
                return start, LOW
            return start, _GLOG_LEVELS.get(message[start], LOW)
    return None


def failed(message: str, low: str) -> bool:
    """Whether the line holds a word of the failure vocabulary (`low`: the line lowercased)."""
    if "over" in low and "fail" in low:  # a failover (a device to fail over to) is a way to go on, not a failure
        low = _FAILOVER.sub("", low)
    return any(word in low for word in _FAILURE_WORDS) or (
        any(hint in low for hint in _BOUNDED_HINTS) and _BOUNDED_FAILURE.search(message) is not None
    )


def fatal_by_structure(message: str, low: str) -> bool:
    """Whether a line no family names is fatal by its structure: a fatal mark; an error mark with a failure word; no
    mark but a failure word in a daemon's or a component's frame, a strong one in the kernel's (the Neuron driver's
    frame adds its timeouts), or one in an unlevelled failure's shape; no mark but `unable` or a device runtime's
    refusal to start (`_REFUSED`) in its own frame, or that refusal at an error mark. Never a line marked low, nor
    one from a side channel. `low` is the line lowercased; the substring tests go first."""
    failure = failed(message, low)
    refused = not failure and _refused(message, low)
    framed = refused or (not failure and any(hint in low for hint in _FRAMED_HINTS))
    if not (failure or framed or "fatal" in low or "critical" in low) or _SIDE_CHANNEL in message:
        return False
    lead = _LEADING_MARK.match(message)
    if lead is not None and failure:  # a tool's `error:` is its level, not what failed: the rest must say or code that
        failure = failed(message[lead.end() :], low[lead.end() :]) or _LEAD_CODE.match(message, lead.end()) is not None
    mark = level(message)
    if mark == FATAL:
        return True
    if mark == LOW or not (failure or framed):
        return False
    if failure and _HYPOTHETICAL.search(message) is not None:  # a failure only foretold is none yet
        said = _HYPOTHETICAL.sub("", message)
        failure = failed(said, said.lower())
        if not (failure or framed):
            return False
    kernel = _KERNEL.search(message) is not None
    if kernel and _RECOVERED.search(message) is not None:
        return False
    if _probed(message, low):  # its mark is not fatal (returned above)
        return False
    if framed:  # a runtime's or a driver's own frame, no level; or a refusal at the collectives' error level
        if mark == ERROR:
            return refused
        return mark is None and (_COMPONENT.search(message) is not None or _DRIVER_TAG.search(message) is not None)
    if mark == ERROR or _COMPONENT.search(message) is not None or _UNLEVELLED_FAILURE.search(message) is not None:
        return True
    return kernel and (
        _KERNEL_FAILURE.search(message) is not None or _NEURON_DRIVER_FAILURE.search(message) is not None
    )


def probe(message: str, low: str) -> bool:
    """Whether the line reports a platform probe's failure that was logged, not raised (`_PROBE`), at no fatal level.
    `low` is the line lowercased."""
    return _probed(message, low) and level(message) != FATAL


def _probed(message: str, low: str) -> bool:
    """Whether the line reports a platform probe's failure not behind an exception's name, whatever its level."""
    if not any(hint in low for hint in _PROBE_HINTS):
        return False
    found = _PROBE.search(message)
    return found is not None and _RAISED.search(message, 0, found.start()) is None


def _refused(message: str, low: str) -> bool:
    """Whether a device runtime's or driver's line says it has no device to run on or too old a dependency."""
    return (
        any(hint in low for hint in _REFUSAL_HINTS)
        and _REFUSAL_FRAMES.search(message) is not None
        and _REFUSED.search(message) is not None
    )


def libfabric_low(message: str) -> bool:
    """Whether the line is libfabric's own at a low level (`<info>`, `<trace>`, `<debug>`)."""
    return "libfabric:" in message and _LIBFABRIC_LOW.search(message) is not None


def quiet(message: str) -> bool:
    """Whether the line's level is low (a framework logging what it caught)."""
    return level(message) == LOW
