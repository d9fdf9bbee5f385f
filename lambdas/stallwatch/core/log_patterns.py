"""Notable lines in training logs: fatal errors by kind and checkpoint markers, the one table both signal sources use.

    match("RuntimeError: CUDA error: an illegal memory access was encountered")  # "illegal_memory_access"
    match("step 120 loss 2.31")  # None
    marker("Saving model checkpoint to /opt/ml/checkpoints/checkpoint-500")  # "checkpoint_start"

A line is read by its structure before its strings: a line that says the job goes on (a retry, a skipped batch, an
ignored exception, a fallback, a Python warning: `survives`) is never fatal; a signature of a family (its error names
and codes, its launcher's exit report: the first rule that matches, the specific ones before the general ones) names
the line, except that a rule marked `strict` yields to a low level (INFO, WARNING: frameworks log the errors they catch
at those levels); and a line no signature names is fatal by its structure (`log_structure`: the level its layout marks
it with, a closed vocabulary of failure words, the layouts that frame a line with no level), then named by the family
its words name (`ERROR_LINE` when none does). A checkpoint marker is read the same way: a save verb of a closed list,
its tense saying whether the save goes on or is done, with what it saves or where it goes, beside the frameworks' own
completion lines. Every rule is linear in the line (no nested quantifiers; bounded gaps), since the engine runs them on
every tail line of hundreds of hosts. The kinds and their real lines are in corpus/real_lines/
(tests/core/test_real_lines.py holds the figures on the part the rules were written from; bench/log_lines.py prints
the parts they were not).

CloudWatch Logs returns only the lines one of `FILTER_PATTERNS` keeps (a ``%regex%`` filter pattern each: CloudWatch's
regex subset, no parentheses, at most 1,024 characters), a superset of what the rules name: `FATAL_FILTER_PATTERN`
(the subscription filter's) and `CHECKPOINT_FILTER_PATTERN`. A policy adds its own lines (`LinePatterns.extended`).

Kept whole (over 500 lines): the kinds, their gates and the filter patterns built from them are one table,
read together; apart, a kind's rule and its server-side needle would drift.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from stallwatch.core import log_structure
from stallwatch.core.contract import STACKS_MARKER

# Fatal kinds, the names a line's `pattern` takes.
NCCL = "nccl"
NCCL_TIMEOUT = "nccl_timeout"
C10D_TIMEOUT = "c10d_timeout"
EFA = "efa"
ILLEGAL_MEMORY_ACCESS = "illegal_memory_access"
CUDA_OOM = "cuda_oom"
CUDA_ERROR = "cuda_error"
XID = "xid"
OOM_KILL = "oom_kill"
SEGFAULT = "segfault"
SIGABRT = "sigabrt"
BUS_ERROR = "bus_error"
SLURM = "slurm"
MPI = "mpi"
SAGEMAKER = "sagemaker_toolkit"
DEEPSPEED_LAUNCHER = "deepspeed_launcher"
LAUNCHER_EXIT = "launcher_exit"
KILLED = "killed"
TRACEBACK = "traceback"
PYTHON_EXCEPTION = "python_exception"
NEURON = "neuron"
XLA = "xla"
RAY = "ray"
LSF = "lsf"
STORAGE = "storage"
KUBERNETES = "kubernetes"
CONTAINER = "container"
ERROR_LINE = "error"
USER_FATAL = "user_fatal"

# NVIDIA's Xid catalogue: events that leave the running process alive (a row marked for remapping, a remapping that
# could not be recorded, a recovery action changed); 144-150 NVLink events are a death only when marked "Fatal".
XID_INFORMATIONAL = frozenset({63, 64, 154})
XID_NVLINK = range(144, 151)
_XID = re.compile(r"\bXid \((?:PCI:)?[0-9A-Fa-f:.]{1,20}\): (\d{1,4})\b")
_NVLINK_NONFATAL = re.compile(r"\bNonfatal\b")

# The network plugin (aws-ofi-nccl) failing to initialise at start-up, in its own words or the collectives' ("NET/OFI
# aws-ofi-nccl initialization failed", "OFI plugin initNet() failed", "NET/OFI Unable to find a protocol that worked.
# Failing initialization.": the Neuron NKI quickstart's single instance): NCCL falls back to sockets and trains on.
# Not a component it says is uninitialised when a call comes (v1.x's `NCCL OFI component is not initialised.`).
_PLUGIN_INIT = r"(?:NET/)?OFI [^\n]{0,60}?(?<!not )(?<!been )(?<!un)(?i:initiali[sz]|initNet)"
# What NCCL's WARN (its only level for errors) and the Neuron collectives' CCOM WARN, its port, say when a peer fails.
# A failover is no failure; a mismatch across ranks and an algorithm or transport not available end its set-up, as do
# a bootstrap message cut short, two ranks on one GPU, a revoked communicator and no interface found (bootstrap.cc,
# init.cc, enqueue.cc: each returns an error).
_COLLECTIVE_FAILURE = (
    r"(?i:fail(?![- ]?over)|error|closed|abort|timed? ?out|refused|reset|broken|mismatch|not available|truncated"
    r"|\bduplicate|\brevoked|\bno [\w/]{1,40}(?: [\w/]{1,40})? (?:available|found)\b)"
)


class Rule(NamedTuple):
    """A kind's regex, and its gate: lowercase phrases one of which every line the regex matches holds (a substring
    test costs a fraction of a regex scan; tests/core/test_log_patterns.py checks every alternative holds one).
    `strict`: a low severity mark on the line (INFO, WARNING) makes it ordinary, as frameworks log what they catch."""

    name: str
    regex: re.Pattern[str]
    gate: tuple[str, ...]
    strict: bool = False

    def search(self, message: str, low: str) -> bool:
        for phrase in self.gate:
            if phrase in low:
                return self.regex.search(message) is not None
        return False


# Fatal kinds, most specific first.
RULES: tuple[Rule, ...] = (
    Rule(
        ILLEGAL_MEMORY_ACCESS,
        re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("illegal",),
    ),
    Rule(
        CUDA_OOM,
        re.compile(r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUDA error: out of memory"),
        ("out of memory", "outofmemoryerror"),
        strict=True,  # fairseq's "WARNING: ran out of memory with exception: CUDA out of memory ...": a skipped batch
    ),
    Rule(
        CUDA_OOM,  # TensorFlow's BFC allocator giving up (bfc_allocator.cc, at W: the op then fails with OOM); the
        # allocation that may fail says `with freed_by_count=N. The caller indicates that this is not a failure`
        # and the op that could not allocate (op_kernel.cc allocate_tensor's ResourceExhausted): its message's own line,
        # or behind its status code in a list of root errors (behind an exception's name it is that exception's)
        re.compile(
            r"\bAllocator \([^)\n]{1,40}\) ran out of memory trying to allocate \S{1,20} \(rounded to \d"
            r"|(?:^\s{0,8}|:  )OOM when allocating tensor with shape\b"
        ),
        ("ran out of memory", "oom when allocating"),
    ),
    Rule(
        NCCL,
        re.compile(
            r"\bnccl(?:Remote|Internal|System|UnhandledCuda|InvalidUsage|InvalidArgument)Error\b"
            r"|DistBackendError|\b(?i:NCCL error)\b|Test NCCL failure|\bCuda failure (?:\d{1,4} )?'"
            r"|Got completion from peer"
            rf"|(?:NCCL|CCOM) WARN (?!NET/OFI)[^\n]{{0,400}}?{_COLLECTIVE_FAILURE}"  # the network plugin's: EFA's
            r"|Exception raised from ncclCommWatchdog"
            # NCCL's socket transport, in its own words, or in its frame before 2.3 (no `NCCL ` before its WARN, so
            # `log_structure` reads its other failures)
            rf"|(?:\b(?:socketProgress\w{{0,20}}|Net) ?: |{log_structure.NCCL_FRAME})[^\n]{{0,200}}?"
            r"(?:Connection (?:closed|reset) by (?:remote )?peer|Call to recv from \S{1,80} failed)"
        ),  # a socket error alone ("Connection reset by peer") is NCCL's only when NCCL or its transport says so
        (
            "nccl",
            "distbackenderror",
            "cuda failure",
            "got completion",
            "ccom warn",
            "socketprogress",
            "connection",
            "call to recv",
        ),
    ),
    Rule(
        NCCL_TIMEOUT,
        re.compile(
            r"Watchdog caught collective operation timeout"
            r"|Some NCCL operations have failed or timed out"
            r"|ProcessGroupNCCL\S{0,40}\s.{0,300}timed out"
            r"|Heartbeat monitor timed out"
            r"|Exception \(either an error or timeout\) detected by watchdog"
            r"|Timeout at NCCL work"
            r"|we are taking the entire process down"
            r"|Exception raised from checkTimeout|watchdog got stuck"
            r"|NCCL communicator was aborted|\bAbort COMPLETE\b"  # what the watchdog does after a timeout, too
        ),
        ("watchdog", "nccl", "heartbeat", "timeout", "process down", "abort complete", "timed out"),
    ),
    Rule(
        EFA,
        re.compile(
            r"NET/OFI [^\n]{0,200}?(?:fail|error|Unable|Couldn't|Unexpected)"
            # the plugin's data path returning an error to NCCL in words none of those hold (nccl_ofi_rdma.cpp,
            # nccl_ofi_sendrecv.cpp): a request or communicator it has no record of, a call on a closed one, a queue
            # or pool with no room left, a registration not done; NCCL ends the communicator on the error
            r"|NET/OFI (?:[^\n]{0,120}? for non-existent |Called \w{1,20} on inactive communicator"
            r"|Can not support more than \d|Receiver eager queue full|No free \w{1,20} header buffers"
            r"|No freelist items available|Duplicate request in|RECV event had NULL ctx|Memory registration may not)"
            # and, in its 1.x releases (nccl_ofi_net.c, v1.0.0 to v1.7.4), a state a call cannot go on from, in words
            # none of those hold: a component or device not initialised, a pool or key with none left, an argument
            # check (an incorrect device, a NULL array, an address longer than its buffer), a provider with too few
            # tag bits, a listen communicator already connected, a registration of a device buffer
            r"|NET/OFI [^\n]{0,160}?(?:\b(?:not (?:been )?|un)(?:initiali[sz]ed|allocated)\b|\bIncorrect \w|\bis NULL\b"
            r"|\bNo [\w-]{1,30}(?: [\w-]{1,30}){0,2} (?:is )?available\b|\bis larger than\b|\bdoes not provide enough\b"
            r"|\balready has an active\b|\bhost buffers only\b)"
            r"|OFI NCCL failure|\bfi_\w{1,40} failed|Unable to write to EQ\b"
            # libfabric reporting a completion-queue or event-queue error (err:, prov_err:; its rxr era's `Writing error
            # Input/output error to EQ.`, efa's `rxr_eq_write_error`, which aborts where no EQ is bound)
            r"|libfabric:\S{1,120}:[ce]q:\S{1,120}<warn>"
            r"|\binfiniband efa_\d{1,3}: Failed"  # the EFA kernel driver
            # the Neuron runtime finding no OFI plugin or EFA for a job across instances (nrt-troubleshoot)
            r"|\bUnable to run multi-instance workload\b"
            # and, in its PCI frame (`efa 0000:00:06.0 efa_0: `, its ib device's once registered), the states it stops
            # in with no failure word (amzn-drivers kernel/linux/efa): an admin command with no completion (the admin
            # queue's running bit cleared: every later command fails), the closed admin queue those meet, and a probe
            # that returns for want of its BARs
            r"|\befa 0000:[0-9a-f]{2}:[0-9a-f]{2}\.\d(?: [\w-]{1,40})?: (?:The device (?:didn't send any|sent a) "
            r"completion|Admin queue is closed|Wait for completion \(polling\) timeout"
            r"|(?:Doorbells )?BARs? unavailable)"
            # PSM, the transport of the Omni-Path (psm2) and PSM3 providers, failing to open its device
            r"|(?<![A-Za-z])PSM[23]? (?:can't|was unable to|could not) "
            # a libfabric call's negative errno, as an application or fabtests (FT_PRINTERR) prints it, fabtests' own
            # wrappers (ft_sendmsg) too
            r"|\bfi_[a-z]\w{0,40}(?:\(\))?: -\d{1,4} \(|\bf[it]_[a-z]\w{0,40}\(\): \S{1,200}:\d{1,6}, ret=-\d"
        ),
        (
            "net/ofi",
            "ofi nccl failure",
            "fi_",
            "unable to write to eq",
            "libfabric",
            "failed",
            "psm",
            ", ret=-",
            "efa 0000:",
            "unable to run",
        ),
    ),
    Rule(
        C10D_TIMEOUT,
        re.compile(
            r"DistStoreError|DistNetworkError|\bSocket Timeout\b|\bRendezvous\w{0,20}(?:Error|Timeout)"
            r"|Timed out waiting \d+ ?ms|socket has timed out|\bwait timeout after\b"
            r"|Timed out after \d+ seconds waiting"
            r"|Timed out initializing process group|server socket has failed to"
        ),
        ("diststoreerror", "distnetworkerror", "socket", "rendezvous", "timed out", "wait timeout"),
    ),
    Rule(
        CONTAINER,  # libnvidia-container's CLI in err(3)'s layout, the stage that failed (src/cli/configure.c: its
        # warnx and warn, then EXIT_FAILURE; the prestart hook fails, the container does not start), whatever its text
        # docker run's and docker create's reportError (cli/command/container/run.go): the daemon's refusal behind
        # `docker: ` (an unknown runtime, a device driver it cannot select), then exit status 125: no container ran
        re.compile(
            r"^\s{0,8}nvidia-container-cli: [a-z][a-z ]{0,40} (?:error|failed): "
            r"|^(?:[\w./-]{0,80}/)?docker: Error response from daemon: "
        ),
        (" error: ", "failed: ", "docker: error response"),
    ),
    Rule(
        XID,
        re.compile(
            r"NVRM: Xid\b|GPU has fallen off the bus|fallen off the bus and is not responding"
            # nvidia-smi finding a GPU NVML cannot open, `for GPU<PCI bus id>: ` and an NVML error string
            # (nvmlErrorString: `Unknown Error`, `GPU is lost`, `GPU requires reset`, ...): the device is gone from
            # under its processes
            r"|\bUnable to determine the device handle for GPU ?[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d: "
        ),
        ("xid", "fallen off the bus", "unable to determine the device handle"),
    ),
    Rule(
        CUDA_ERROR,
        re.compile(
            r"\bCUDA error\b|\bcudaError[A-Z]\w*|c10::CUDAError|device-side assert triggered|unspecified launch failure"
            r"|CUBLAS_STATUS_(?!SUCCESS)[A-Z_]+|CUDNN_STATUS_(?!SUCCESS)[A-Z_]+|uncorrectable ECC error"
            r"|Exception raised from \w+ at \S{0,200}?(?i:cuda)|CUDA driver error"
        ),
        ("cuda", "device-side", "launch failure", "cublas_status", "cudnn_status", "ecc error"),
        # a CUDA error a framework caught and logs low: c10d's watchdog at INFO when the driver shuts down at exit
        # (ProcessGroupNCCL.cpp, `main process destroyed cuda before watchdog loop exited, terminating watchdog.
        # (Watchdog caught exception: CUDA driver error: driver shutting down`)
        strict=True,
    ),
    Rule(
        NCCL,
        re.compile(r"watchdog thread terminated with exception"),
        ("watchdog thread terminated",),
        # torch 1.8's c10d logs it at INFO and ends the thread alone (torch/lib/c10d/ProcessGroupNCCL.cpp
        # ncclCommWatchdog: caught, nothing rethrown); from 2.x it is LOG(ERROR), rethrown as DistBackendError
        strict=True,
    ),
    Rule(
        OOM_KILL,
        re.compile(
            r"Out of memory: Kill(?:ed)? process|invoked oom-killer|\boom-kill:|oom_reaper: reaped"
            r"|Memory cgroup out of memory|\boom[-_]kill events?\b|killed by signal: Killed|\bOut Of Memory\b"
            r"|\bKilled process \d+ \(|Exceeded (?:job|step) memory limit|\bOOMKilled\b"
        ),
        ("out of memory", "oom", "killed by signal: killed", "killed process", "exceeded"),
    ),
    Rule(
        SEGFAULT,
        re.compile(
            r"(?i:segmentation fault)|SIGSEGV|\bsegfault at [0-9a-f]+ ip |\b[Ss]ignal 11\b|\bexit code 139\b"
            r"|\*\*\* SIG[A-Z]+ \(@"
        ),
        ("segmentation fault", "sigsegv", "segfault", "signal 11", "exit code 139", "*** sig"),
    ),
    Rule(
        SIGABRT,
        re.compile(
            r"terminate called (?:after throwing|without an active exception|recursively)|SIGABRT|\b[Ss]ignal 6\b"
            r"|Signal Received: 6\b|Aborted \(core dumped\)|Fatal Python error|\*\*\* (?:BACKTRACE|Aborted at)\b"
            r"|: Assertion `[^\n]{1,300}' failed[.!]$"  # glibc's assert() and ld.so's, which abort
            # UCX's ucs_assert (ucs/debug/assert.h), `file:line Assertion `expr' failed[: message]`, then abort()
            r"|\.c:\d{1,6} {1,4}Assertion `[^\n]{1,300}' failed(?:: [^\n]{0,300})?$"
            r"|^\s{0,8}what\(\): "  # libstdc++'s second line after "terminate called after throwing ..."
            # glibc's malloc_printerr catalogue, each message the whole line before abort(): a function's name and
            # what it found, in the catalogue's words (invalid, corrupt, detected, mismatching: `free(): invalid
            # pointer`, `malloc(): corrupted top size`) or the corruption alone (`double free or corruption (!prev)`);
            # before 2.26 inside `*** Error in `prog': ...: 0x... ***` (its default check_action prints, then aborts)
            r"|^\s{0,8}(?:\*\*\* Error in `[^'\n]{1,200}': )?"
            r"(?:(?:(?:m|re|c)alloc|free|munmap_chunk|malloc_consolidate|tcache_thread_shutdown)\(\): "
            r"[^\n]{0,60}?(?:invalid|corrupt|detected|mismatching)[^\n]{0,60}?"
            r"|double free or corruption \([!\w]{1,10}\)"
            r"|corrupted (?:size vs\. prev_size|double-linked list)[^\n]{0,40}?)(?:: 0x[0-9a-f]{1,16} \*\*\*)?\s*$"
            # glibc's fortify and stack protector (__fortify_fail), libstdc++'s __cxa_pure_virtual: then terminate
            r"|^\*\*\* [a-z][a-z ]{1,40} detected \*\*\*: (?:[^\n]{1,200} )?terminated\s*$"
            r"|^\s{0,8}(?:pure|deleted) virtual method called\s*$"
            # glog's CHECK failure, and the program counter glog's and absl's failure signal handlers dump first
            r"|\*\*\* Check failure stack trace: \*\*\*|^\s{0,8}PC: @ {1,20}(?:0x)?[0-9a-f]{1,16}\b"
            # and the frames they dump after it (absl's examine_stack.cc `@ %*p  %9d  %s`, its `(unknown)` size; glog's
            # utilities.cc DumpPCAndSymbol `@ %*p  %s`); absl's raw CHECK, which no level marks (raw_logging.h
            # ABSL_RAW_CHECK: `[file : line] RAW: Check cond failed: msg`, then abort())
            r"|^\s{0,8}@  {0,19}0x[0-9a-f]{1,16} {1,20}\S|\bRAW: Check [^\n]{1,300}? failed: "
        ),
        (
            "alloc(): ",
            "malloc_consolidate(): ",
            "free(): ",
            "chunk",
            "corrupt",
            "tcache",
            "terminated",
            "virtual method called",
            "check failure stack trace",
            "pc: @",
            "@ ",
            "terminate called",
            "sigabrt",
            "signal 6",
            "signal received: 6",
            "aborted",
            "fatal python error",
            "*** backtrace",
            "failed",
            "what(): ",
        ),
    ),
    Rule(
        BUS_ERROR,
        re.compile(r"killed by signal: Bus error|(?i:bus error) (?:\(core dumped\)|encountered)|: Bus error$"),
        ("bus error",),
    ),
    Rule(
        STORAGE,  # the messages of the errno values a write or a read dies of (strerror), and the kernel's own
        re.compile(
            r"No space left on device|Disk quota exceeded|Read-only file system|Input/output error|\bI/O error\b"
            r"|Remounting filesystem read-only|\bEXT4-fs error\b"
        ),
        (
            "no space left",
            "quota exceeded",
            "read-only",
            "input/output error",
            "i/o error",
            "ext4-fs error",
        ),
        strict=True,  # a warning quoting one (joblib's "UserWarning: [Errno 28] ...") is a job going on
    ),
    Rule(
        KUBERNETES,  # a pod's terminal state: a status field's value, a table's cell; the kubelet's own words
        re.compile(
            r"^\s{0,12}(?:[Rr]eason|[Ss]tatus|[Pp]hase|[Tt]ype|State):\s{1,30}"
            r"(?:Evicted|Failed|OOMKilled|CrashLoopBackOff|Preempted|Terminated)\s*$"
            r"|\s{2}(?:Evicted|CrashLoopBackOff)\s{2}"
            r"|\bThe node was low on resource:|\bPreempted to accommodate a workload\b"
            r"|\bKilling container with id\b|\bBack-off restarting failed container\b|\bPod failed\b"
        ),
        (
            "evicted",
            "failed",
            "oomkilled",
            "crashloopbackoff",
            "preempted",
            "terminated",
            "the node",
            "killing container",
        ),
    ),
    Rule(
        SLURM,
        re.compile(
            r"CANCELLED AT \d{4}-\d\d-\d\dT|srun: error: [^:\n]{1,200}: tasks? [\d,\-]{1,100}: "
            r"|srun: (?:Job step aborted|Force Terminated|Terminating|forcing job termination)|\bWTERMSIG \d"
            r"|srun: error: (?:Node failure|Timed out|Unable to (?:allocate|create step))|this job is preempted"
            r"|STEPD TERMINATED"
            # Slurm's own tools in the job's output: an error of theirs, or a step or allocation they say has ended
            r"|\b(?:(?:srun|salloc|sbatch):|slurm(?:stepd|d)(?:-[\w.-]{1,80})?:) "
            r"(?:error: |[^\n]{0,120}?(?i:fail|abort|revoked|cancel|terminat|kill))"
            # sacct's row: a job's or step's terminal State, then its ExitCode (exit:signal)
            r"|\s(?:FAILED|NODE_FAIL|OUT_OF_MEMORY|OUT_OF_ME\+|TIMEOUT|CANCELLED(?: by \d{1,10})?|PREEMPTED)"
            r"\s{1,40}\d{1,3}:\d{1,3}\s*$"
            # AWS ParallelCluster's slurm_plugin (clustermgtd, resume), in its logger's `[slurm_plugin.module:function]
            # - LEVEL - ` frame, at any level (it logs its actions at INFO): nodes it sets DOWN (Slurm requeues or ends
            # their jobs), the instances behind unhealthy nodes it terminates; a DRAIN lets the job finish, and a
            # termination of idle, powering-down or orphaned instances names no unhealthy node
            r"|\[slurm_plugin\.\w{1,40}:\w{1,80}\] - [A-Z]{4,8} - [^\n]{0,100}?"
            r"(?:\b(?:to|into) DOWN\b|\bto down and power_down\b"
            r"|\bTerminating instances (?:that are )?backing unhealthy\b)"
        ),
        (
            "cancelled at",
            "srun:",
            "wtermsig",
            "preempted",
            "stepd terminated",
            "slurm",
            "salloc:",
            "sbatch:",
            "failed",
            "node_fail",
            "out_of_me",
            "timeout",
            "cancelled",
        ),
    ),
    Rule(
        LSF,
        re.compile(
            r"\bTERM_[A-Z_]{3,40}: "  # its termination reasons (TERM_MEMLIMIT: ...), its report's subject:
            r"|^Subject: Job \d{1,12}(?:\[\d{1,9}\])?: <[^>\n]{0,300}> (?:in cluster <[^>\n]{1,100}> )?Exited$"
            r"|^Job <\d{1,12}(?:\[\d{1,9}\])?> is being terminated\b"  # bkill's word for each job it kills
            # the job's terminal state, as the report says it (openlava's sbatchd, job.c) and bjobs -l and bhist -l
            # after an event's time: exited by a signal, with a status out of range, or for a reason after `;` (one
            # that reruns it is none); a limit's or an unreachable host's kill (bhist.c getEventStatus, reason.c)
            r"|^(?:[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d: )?(?:Exited(?:; (?!job will be requeued)"
            r"| by signal \d| with unknown status | with signal termination: )|Terminated: |Termination request issued;"
            r"|Execution host unavailable; job is killed|sbatchd startup; kill )"
            r"|\bSignal <(?:KILL|TERM|INT)> requested by\b"  # bhist: bkill's signal, one that ends the job
            # the job starter's own errors on the job's stderr before it exits (sbatchd job.c)
            r"|^(?:LSF: Unable to |Cannot open your job file: |Corrupted jobfile <)"
        ),
        (
            "term_",
            "exited",
            "terminat",
            "job is killed",
            "sbatchd startup; kill",
            "signal <",
            "lsf: unable to ",
            "cannot open your job file",
            "corrupted jobfile",
        ),
    ),
    Rule(
        MPI,
        re.compile(
            r"MPI_ABORT|total processes killed|refused to die|Primary job\s+terminated normally, but \d+ process"
            r"|non-zero exit code\. Per user-direction|exited with non-zero status|exited on signal \d+"
            r"|BAD TERMINATION|CLEANING UP REMAINING PROCESSES"
            r"|\*\*\* Process received signal \*\*\*|\] Signal: [A-Z][a-z]+|lost communication with a remote daemon"
            # the rest of opal's signal report (opal/util/stacktrace.c: its handler resets, the signal kills after it)
            r"|\] (?:Failing at address|Associated errno): |\] \*\*\* End of error message \*\*\*"
            r"|peer process has unexpectedly disconnected"
            # Open MPI's fatal error handler (errhandler_predefined.c): its banner and the lines saying what it does
            r"|\*\*\* (?:An error occurred in |MPI_ERRORS_ARE_FATAL\b|\s{0,4}and (?:potentially your MPI job"
            r"|MPI will try to terminate))|\bLocal abort (?:before|after) MPI_"
            # its help texts (help-orte-runtime.txt, help-mpi-runtime.txt): what failed, and the code it returned
            r"|\bIt looks like \w{1,40} failed for some reason\b"
            r'|--> Returned (?:value )?[^\n]{1,200}? instead of (?:"Success"|[A-Z]{2,8}_SUCCESS\b)'
            # its error-log macros, with where the error was raised
            r"|\b(?:[A-Z]{3,5}_ERROR_LOG|OPAL ERROR): [^\n]{1,300}? in file \S{1,200} at line \d"
        ),
        (
            "mpi_abort",
            "processes killed",
            "refused to die",
            "primary job",
            "non-zero",
            "exited",
            "bad termination",
            "cleaning up",
            "process received signal",
            "] signal: ",
            "] failing at address: ",
            "] associated errno: ",
            "] *** end of error message ***",
            "lost communication",
            "unexpectedly disconnected",
            "*** an error occurred in",
            "mpi_errors_are_fatal",
            "your mpi job",
            "mpi will try to terminate",
            "local abort",
            "failed for some reason",
            "--> returned",
            "_error_log: ",
            "opal error: ",
        ),
    ),
    Rule(
        SAGEMAKER,
        re.compile(
            r"ExecuteUserScriptError|AlgorithmError|Reporting training FAILURE"
            r"|sagemaker-(?:training-toolkit|containers) ERROR|(?i:framework error):|\bErrorMessage \""
            r"|Failed\. Reason: |\b\d\d:\d\d:\d\d Failed - "  # the SDK's status: "<time> Failed - Training job failed"
        ),
        (
            "executeuserscripterror",
            "algorithmerror",
            "training failure",
            "sagemaker-",
            "framework error",
            "errormessage",
            "failed. reason",
            "failed - ",
        ),
    ),
    Rule(
        NEURON,
        re.compile(
            r"\b(?:ERROR|FATAL)\s{1,8}[A-Z]{2,8}:\w"  # the Neuron runtime's layout: level, COMPONENT:function, message
            r"|\bNRT_(?!SUCCESS\b)[A-Z][A-Z_]{2,40}"  # its status codes (nrt_status.h), e.g. NRT_RESOURCE
            r"|\b(?i:nrt)(?:::|_)\w{2,40}:? (?:failed|status ?= ?[1-9])|\bnrt status code [1-9]|\[NRTD:\w{1,40}\] error"
            r"|\bNEURON_HW_ERR="  # the driver's hardware error in dmesg, with the action it asks for
            # a device's uncorrectable memory errors ending the execution (nrt-troubleshoot: `... on Neuron device: 5:1
            # metadata: 0x2. Failing execution.`); a single one only warns that results may be off, and it goes on
            r"|\bmemory error is detected on Neuron device: [^\n]{0,60}\bFailing execution\b"
            r"|^\s{0,8}[RT]X, connection closed by remote peer"  # the collectives: a peer rank ended
            # a NEFF whose version or features the runtime does not support: it refuses to load the model
            # (NRT_UNSUPPORTED_NEFF_VERSION; the troubleshooting page's `NEFF version mismatch supported: 1.1 ...`)
            r"|\bNEFF (?:version|features?)\b[^\n]{0,120}?(?:\bnot supported\b|\bunsupported\b|\bmismatch\b)"
            # the compiler's own stack, frame by frame at its ERROR level: neuronx-cc prints it only when it dies
            r'|\bERROR \d{1,8} \[neuronx(?:-cc|cc\.[\w.]{1,60})\]:\s{1,4}File "neuronxcc/'
        ),
        ("error", "fatal", "nrt", "neuron_hw_err", "connection closed", "neff"),
    ),
    Rule(
        XLA,
        re.compile(
            r"XlaRuntimeError|Intercepted XLA runtime error|Bad StatusOr access"
            r"|Terminating process because the JAX distributed service detected fatal errors"
        ),
        ("xlaruntimeerror", "xla runtime error", "statusor", "terminating process because"),
    ),
    Rule(
        ERROR_LINE,  # TensorFlow's op kernels report a failed op at W, its status following: the op's error propagates
        re.compile(r"\bOP_REQUIRES failed at \S{1,200} : [A-Z]"),
        ("op_requires failed at",),
    ),
    Rule(
        ERROR_LINE,  # absl's and TensorFlow's status codes leading what a failed call returned (a probe's may be INFO)
        re.compile(
            r"(?:^|[\s:(])(?:INTERNAL|RESOURCE_EXHAUSTED|UNAVAILABLE|DEADLINE_EXCEEDED|DATA_LOSS"
            r"|Internal|Resource exhausted|Unavailable|Deadline exceeded|Data loss): "
        ),
        (
            "internal: ",
            "resource_exhausted: ",
            "resource exhausted: ",
            "unavailable: ",
            "deadline_exceeded: ",
            "deadline exceeded: ",
            "data_loss: ",
            "data loss: ",
        ),
        strict=True,
    ),
    Rule(
        RAY,
        re.compile(
            r"\bRay(?:Task|Actor)Error\b|\b(?:ActorDied|WorkerCrashed)Error\b|\bA worker died or was killed\b"
            r"|\bThe actor (?:died|is dead)\b|Worker exit type: (?:SYSTEM|USER)_ERROR|\bTrial task failed\b"
            r"|\bray\.(?:exceptions|train)\.[\w.]{0,80}?(?:Error|Exception)\b"  # an exception Ray's modules raise
            r"|\bRay killed (?:this|the) worker\b"  # its memory monitor's report, the exception's second line
            r"|\bhas been marked (?:as dead|dead)\b"  # the GCS's verdict on a node it lost, at W and on the driver
            r"|\bWorkers \(tasks / actors\) killed due to memory pressure\b"  # the raylet's memory monitor's summary
            # Ray Train's failure policy giving up (failure_handling/default.py, at INFO): the controller errors and
            # training ends; its `Deciding to RESTART` lines go on
            r"|\bDeciding to TERMINATE\b"
            # the GCS giving up on an actor that died unintended with no restart left (gcs_actor_manager.cc
            # ReconstructActor, at INFO): it goes DEAD; a restart left, or an intentional exit, goes on
            r"|\bActor is failed [^\n]{1,300}?, need_reschedule = (?:1|true), remaining_restarts = 0\b"
        ),
        (
            "actor is failed",
            "deciding to terminate",
            "killed due to memory pressure",
            "marked dead",
            "marked as dead",
            "ray killed",
            "ray.exceptions.",
            "ray.train.",
            "raytaskerror",
            "rayactorerror",
            "actordiederror",
            "workercrashederror",
            "worker died",
            "actor died",
            "actor is dead",
            "worker exit type",
            "trial task failed",
        ),
    ),
    Rule(
        RAY,  # Tune's status report: how many trials errored (its older table and its heartbeat in
        # experimental/output.py, `Trial status: 1 ERROR | 3 TERMINATED`, a Train run's `Training is in ERROR status.`:
        # a trial that is retried goes back to PENDING, so ERROR is a trial failed for good), and the experiment ending
        # with failed trials (tune.py's TuneError and, under raise_on_failed_trial=False, its ERROR line); a status with
        # trials still running or waiting is a sweep going on (`SURVIVES`). A Train run is one trial: its reporter's
        # `Training errored after 3 iterations at ...` (TrainReporter's on_trial_error) is the run failed, where a
        # sweep's `Trial <name> errored after ...` leaves the other trials running
        re.compile(
            r"\bNumber of errored trials: [1-9]|\b(?:Number of trials: [^(\n]{1,40}\(|Trial status: )[^)\n]{0,200}?"
            r"\b\d{1,6} ERROR\b|^Training is in ERROR status\b|(?:ERROR|Error)\b[^\n]{1,60}?\bTrials did not complete\b"
            r"|^Training errored after \d{1,9} iterations\b"
        ),
        ("errored trials", "error"),
    ),
    Rule(
        DEEPSPEED_LAUNCHER,
        re.compile(r"Killing subprocess \d|exits with return code = -?[1-9]"),
        ("killing subprocess", "exits with return code"),
    ),
    Rule(
        LAUNCHER_EXIT,
        re.compile(
            r"\bexitcode[\s:=]{1,4}-?[1-9]|ChildFailedError|^\s*\S{1,300} FAILED\s*$|Signal \d+ \(SIG[A-Z]+\) received"
            r"|failed with return code -?[1-9]|\bExitCode:?\s*-?[1-9]|(?i:exit code):?\s+\(?-?[1-9]"
            r"|\bprocess exited, code=(?:exited|killed|dumped), status=(?!0/)\d{1,3}/"  # systemd: a unit's process
            r"|\bexit(?:ed)?(?: with)?(?: exit| status)? (?:code|status)[ :=]{0,3}-?[1-9]|returned non-zero exit status"
            r"|(?i:process) \d+ terminated with (?:signal|exit code)|Worker group FAILED"
            # torchelastic's agent told to stop (`Received 15 death signal`, 2.x `Received Signals.SIGTERM death
            # signal`, its exit barrier's `Got termination signal: Signals.SIGTERM`), and closing its workers
            # (SubprocessContext's `Sending process N closing signal`, MultiprocessContext's `Closing process N via
            # signal`); its record() on a failure with no error file, before it re-raises
            r"|\b(?:Received (?:\d{1,2}|(?:Signals\.)?SIG[A-Z]{2,6}) death|Got termination) signal\b"
            # torch.multiprocessing's spawn terminating the others once one failed (spawn.py ProcessContext.join)
            r"|(?:Sending process \d+ closing|(?:Closing|Terminating) process \d+ via) signal SIG[A-Z]+"
            r"|\blocal_rank \S{1,8} FAILED with no error file\b"
            r"|^Error executing job with overrides: "  # Hydra: the job's function raised
            r"|\b(?i:exiting|exit) with a non-zero (?:status|exit code)\b"  # an application ending its own run
            # Megatron's rerun state machine ending a run whose result it could not validate: it exits now and asks
            # for the job to be resumed or examined (a planned exit names its iteration or time instead)
            r"|\b[Ee]xiting now\b[^\n]{0,120}?\b(?:[Rr]esume[ds]?|further examination)\b"
            # Kaldi's run.pl closing a job's log with its exit status (`# Ended (code 1) at ...`; 0 for success), the
            # job runner of ESPnet's recipes
            r"|\b[Ee]nded \(code [1-9]"
            # an application's watchdog ending the run when every component of a kind stopped beating (Sample
            # Factory's runner: `Stopping training due to lack of heartbeats from <class ...RolloutWorker'>`)
            r"|\b(?:[Ss]topping|[Aa]borting|[Tt]erminating) (?:the )?(?:training|experiment|run|job) due to lack of "
            r"heartbeats?\b"
        ),
        (
            "exit",
            "childfailederror",
            "failed",
            "signal",
            "return code",
            "non-zero",
            "terminated with",
            "error executing job",
            "lack of heartbeat",
            "ended (code",
        ),
    ),
    Rule(
        KILLED,
        re.compile(
            r"(?:^|[\]\s\\])(?:Killed|Terminated)\s*$"  # the shell's word for a job it saw killed (SIGKILL, SIGTERM)
            r"|\d+\s+Killed\s|\bSIGKILL\b|\b[Ss]ignal 9\b|\b(?:code|status):? 137\b"
            r"|\b(?:[Tt]erminated|[Kk]illed) by (?:[\w ]{0,40} )?signal\b"  # "terminated by User defined signal 2"
            # the shell's report of a job a signal ended (bash's "line N: PID <signal>", strsignal's words), the core
            # it dumped, SIGFPE's own word
            r"|: line \d{1,6}: {1,4}\d{1,8} (?:Killed|Terminated|Aborted|Segmentation fault|Floating point exception"
            r"|Bus error|Illegal instruction|Trace/breakpoint trap|Hangup|Quit|CPU time limit exceeded)\b"
            r"|\bcore dumped\b|(?i:floating point exception)|\bSIGFPE\b"
            # a shell's job report, the signal's words in a padded status column before the command: bash's job table
            # and, from 5.3, its foreground job (`[1]+  Killed        python train.py`, jobs.c print_pipeline), zsh's
            # (`zsh: killed     python train.py`, `[1]  + terminated  ...`: Src/jobs.c printjob, signames2.awk)
            r"|^(?:zsh: |\[\d{1,5}\] {0,2}[+-]? {1,2})?(?:[Kk]illed|[Tt]erminated|Aborted|abort|[Bb]us error"
            r"|User defined signal \d|user-defined signal \d|CPU time limit exceeded|cpu limit exceeded"
            r"|[Ff]ile size limit exceeded)(?: \(core dumped\))? {2,40}\S"
            # a fatal signal a process's handler reports before it dies (UCX's ucs_debug: `Caught signal 7 (Bus error:
            # nonexistent physical address)`), timeout(1)'s --verbose signal to the command it times out
            r"|\b[Cc]aught signal \d{1,2} \([A-Z]|\bsending signal [A-Z0-9]{1,8} to command\b"
            # MPICH's mpiexec (Hydra) on the exit status a signal left, with its strsignal (mpiexec.c)
            r"|\bEXIT STRING: [^\n]{1,40}? \(signal \d{1,2}\)"
            # a signal said received (Lightning's "Received SIGTERM: 15", Megatron's "after receiving SIGTERM"), Ctrl+C
            # (the exception, or its words: Sample Factory's `Keyboard interrupt detected in driver loop, exiting...`)
            r"|\b[Rr]eceiv(?:ed|ing) SIG(?:TERM|INT|KILL)\b|\b(?:KeyboardInterrupt|[Kk]eyboard interrupt)\b"
        ),
        (
            "received sig",
            "receiving sig",
            "keyboardinterrupt",
            "keyboard interrupt",
            "killed",
            "terminated",
            "sigkill",
            "signal 9",
            "137",
            ": line ",
            "core dumped",
            "floating point exception",
            "sigfpe",
            "bus error",
            "abort",
            "caught signal",
            "sending signal",
            "defined signal",
            "exceeded",
            "exit string",
        ),
    ),
    Rule(
        TRACEBACK,
        re.compile(
            r"Traceback \(most recent call last\)|\(most recent call first\)"
            r"|The above exception was the direct cause|During handling of the above exception"
            # a frame's source line raising an exception class, which only a traceback quotes (the legacy
            # torch.distributed.launch's `raise subprocess.CalledProcessError(returncode=process.returncode,`)
            r"|^\s{0,8}raise [\w.]{0,80}(?:Error|Exception)\b"
        ),
        ("traceback", "most recent call", "above exception", "error", "exception"),
        strict=True,
    ),
    Rule(
        PYTHON_EXCEPTION,
        re.compile(
            r"\b[A-Z]\w{0,60}(?:Error|Exception)(?: \([^)\n]{1,60}\))?: |(?:^|\s)Exception: |\b[A-Z]\w{0,60}Error$"
        ),  # TensorFlow's "ResourceExhaustedError (see above for traceback): " too
        ("error", "exception"),
        strict=True,
    ),
)

# The families a line's words name, for a line read fatal by its structure: most specific first (the Neuron runtime
# before XLA, torch-neuronx running on XLA; EFA before NCCL, its plugin speaking in NCCL's lines).
_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        NEURON,  # its components, status codes, and the device and core its runtime addresses a report to
        re.compile(
            r"\b(?i:nrtd?|tdrv|nmgr|kmgr|neff|(?:lib)?n?ccom|neuron\w{0,20})\b|\b(?:NRT|NCC|NERR)_[A-Z]|\bFATAL-RT-"
            r"|\bTensorizer\b"  # the compiler's pass that reports its transformation errors
            r"|\[(?:ND|MLA) \d{1,3}\]|\bnd\d{1,3}:? ?nc\d"
        ),
    ),
    (EFA, re.compile(r"NET/OFI|\b(?i:libfabric|efa)\b|\bfi_[a-z]\w{0,30}")),
    (NCCL, re.compile(rf"\b(?i:nccl)|{log_structure.NCCL_FRAME}")),  # its frame before 2.3 names no NCCL
    (SLURM, re.compile(r"\b(?:slurm\w{0,20}|srun|salloc|sbatch)\b")),
    (RAY, re.compile(r"\b(?i:ray|raylet)\b")),
    (XLA, re.compile(r"\b(?i:xla|jax|jaxlib|pjrt|tpu)\b")),
    (XID, re.compile(r"\bNVRM:")),  # the NVIDIA kernel driver: a GPU that failed to initialise, no Xid to name it
    (STORAGE, re.compile(r"\b(?:EXT4-fs|JBD2|XFS|Lustre\w{0,10}|blk_update_request|print_req_error|nvme\d)|I/O error")),
    (
        CONTAINER,
        re.compile(r"\b(?i:docker|containerd|runc|oci runtime|nvidia-container\S{0,10}|enroot|pyxis|podman)\b"),
    ),
    (KUBERNETES, re.compile(r"\b(?:kubelet|Pod|pod)\b")),
    (CUDA_OOM, re.compile(r"\bOOM\b|(?i:out of memory)")),
    (CUDA_ERROR, re.compile(r"\b(?i:cuda)\b")),
)
PATTERN_NAMES: tuple[str, ...] = (
    *dict.fromkeys((*(rule.name for rule in RULES), *(kind for kind, _ in _FAMILIES))),
    ERROR_LINE,
    USER_FATAL,
)

# Lines that say the job goes on: never fatal, whatever else they say (the engine judges a block they end or begin):
# a retry (not one given up: Spark's `; not retrying`), a skipped batch, an ignored exception, a fallback (the network
# plugin's failed start-up among them).
SURVIVES = Rule(
    "survives",
    re.compile(
        r"(?i:(?<!\bnot )\bretrying\b|\bwill retry\b|\bretry loop\b|\bskipping\b|\bignor(?:ed|ing)\b|\bfalling back\b"
        r"|\bwaiting for rescheduling\b"  # LSF's requeued job
        r"|\bfall ?back to\b|\b(?:suppress|squelch)ing\b|\bnot a failure\b"  # aws-ofi-nccl's `fallback to <value>`
        r"|\b(?:going to|using|use) \S{1,120} instead\b"
        # a fallback a component takes now, in a few words (NCCL's `Cannot initialize CollNet, using point-to-point
        # network instead`), not an exception's advice (`consider using ... instead`)
        r"|(?<![Cc]onsider )(?<![Tt]ry )\busing (?:\S{1,60} ){1,3}?\S{1,60} instead\b"
        r"|\bnon-fatal\b|\bnonfatal\b)"  # a line that calls its own event non-fatal (NCCL's IB async events)
        # a line that says the work goes on past what it reports (libfabric efa's `Communication will continue.`), or
        # drops or defers what it cannot handle (its stale PEER_ERROR_PKT `; dropping.`, `; deferring rxe release`)
        r"|\b(?:[Cc]ommunication|[Ee]xecution|[Tt]raining) will continue\b|; (?:dropping|deferring|leaking)\b"
        # a feature given up and the job going on without it (PSM3's `... failed. Disabling CMA support`), a failure
        # followed by the fallback it tries (mercury's `Could not find matching interface for ib0, attempting to use it
        # as domain name`)
        r"|\bDisabling (?:[\w-]{1,40} ){1,4}(?:support|features?)\b|, (?:attempting|trying) to use\b"
        # NCCL's IB discovery skips a device it cannot open, or IB as a whole when it finds no IP interface
        # (ncclIbInit, ncclIbInitDevices: sockets are tried next; Bootstrap's `no socket interface found` is fatal)
        r"|\bCall to ibv_open_device failed\b|\bNET/IB ?: (?:Unable to open device|No IP interface found)\b"
        # or finds no library for an optional transport (ibvwrap.cc's `Failed to open libibverbs.so[.1]`: sockets
        # instead; gdrwrap.cc's `Failed to open libgdrapi.so`: no GDRCopy)
        r"|\bFailed to open lib(?:ibverbs|gdrapi)\b"
        # NCCL's IB resiliency (transport/net_ib/p2p_resiliency.cc, 2.30) moving a failed device's traffic to the others
        # (`Device 0 marked as failed. Initiating recovery? Yes`, only once it has judged the error not fatal; its fatal
        # one is `The error is fatal (...). Cannot continue.`), and dropping a completion it had already handled (`stale
        # CQE with error ... Slot was already handled`)
        r"|\b[Ii]nitiating (?:[\w-]{1,30} )?recovery\b|\b(?:was|were) already handled\b"
        # NCCL's proxy service thread skipping an accept that failed or dropping a local peer whose socket broke, and
        # serving the others (proxy.cc, v2.12 to 5067397): a peer gone, e.g. a vLLM worker at exit. An operation it
        # fails (`Error encountered progressing`, `Failed to execute operation`) fails the rank waiting on it.
        r"|\[Service thread\] (?:Accept failed|Could not receive type)\b"
        # a rate-limited report counting the copies it held back: its reporter goes on and logs again later (the
        # Neuron driver's sysfs power reader, neuron_power.c: `..., skipped 3 log messages`)
        r"|\bskipped \d{1,10} log(?:ging)? messages\b"
        # a retry by another name: tasks resubmitted (Ray's core worker recovering lost objects, logged at E), a message
        # sent again (ps-lite's resender: `Timeout to get the ACK message. Resend (retry=1)`), a group of workers
        # restarted after a failure (Ray Train's controller at ERROR: `Restarting training worker group after
        # encountering failures on 2 worker(s):`, its failure policy's RESTART; its TERMINATE is `RAY`'s)
        r"|(?i:\bresubmitting\b|\bresend(?:ing)?\b)|\bRestarting (?:[\w-]{1,40} ){0,4}after\b"
        # a trial of a search said failed, by its number (Optuna's `Trial 3 failed with parameters: {...} because of the
        # following error: ...`, 2.x's `Trial 3 failed because of ...`, 0.x-1.x's `Setting status of trial#3 as
        # TrialState.FAIL because ...`: study/_optimize.py; hyperopt's SparkTrials, `trial task 3 failed, exception is
        # ...`): the search records it and runs the next; an exception it re-raises (Optuna's, outside `catch`) is fatal
        # in its own traceback
        r"|\b[Tt]rial (?:task )?\d{1,9} failed\b|\bstatus of trial#\d{1,9} as TrialState\.FAIL\b"
        # a sweep going on past a trial that errored: Tune's status report with trials still RUNNING, PENDING or PAUSED
        # (progress_reporter.py's `Number of trials: 4/4 (1 ERROR, 1 PENDING, 2 RUNNING)`, experimental/output.py's
        # `Trial status: 1 ERROR | 2 RUNNING | 1 PENDING`; its states are the trials', not a level)
        r"|\b(?:Number of trials: [^(\n]{1,40}\(|Trial status: )[^)\n]{0,200}?\b\d{1,6} (?:RUNNING|PENDING|PAUSED)\b"
        # a metrics logger (the experiment tracker) that could not be set up: training goes on without it
        # (torchtitan's `ERROR - Failed to create WandB logger: ...`)
        r"|\b[Ff]ailed to (?:create|initiali[sz]e|set ?up|start) (?:the |a )?[\w-]{1,30} logger\b"
        # SageMaker's intermediate output sync (sagemaker-training-toolkit intermediate_output.py): a file it could not
        # copy or upload is logged at ERROR and dropped; the sync and the training go on
        r"|\bFailed to (?:upload file to s3|copy file to the temporary directory)\b"
        # Python's warnings (UserWarning: ...), c10's "Warning:", a tool's after its name (Kaldi's `run.pl: Warning: `)
        r"|\b[A-Z][A-Za-z]{1,40}Warning: |(?:^|\] |: )Warning: "
        # a default taken in place of what failed (dlrover's port sync, `exhausted 120 sync time. use default port`), a
        # measurement of lesser accuracy (XLA's GPU timer at E: `Delay kernel timed out: measured time has sub-optimal
        # accuracy.`, gpu_timer.cc, which returns the duration)
        r"|\b(?:[Uu]se|[Uu]sing) (?:the )?default\b|\b(?:sub-?optimal|reduced|degraded) (?:accuracy|precision)\b"
        # a checkpoint save that failed in a saver beside the training (dlrover's flash checkpoint saver, in the
        # agent: `Fail to save the checkpoint shard 0 of rank 0, error: ...`, `Rank 0 save checkpoint failed for step
        # 1000`, `Commit checkpoint timeout for step 1000`, ckpt_saver.py, each then returns and the next save is
        # tried; a save that ends the run raises, its traceback the fatal line; a trainer's own `Failed to save
        # checkpoint` may be its last words, so only the saver's shard and step forms are read here, its `shared` too)
        r"|(?i:\bfail(?:ed|s)? to (?:save|persist|commit) (?:the )?checkpoint "
        r"(?:shar(?:d|ed) \d|[^\n]{0,40}?for step \d)"
        r"|\b(?:save|persist|commit)\w{0,3} checkpoint (?:failed|timeout) for step\b"
        r"|\bexception during checkpointing\b)"
        rf"|{_PLUGIN_INIT}"
        # or a WARN its start-up prints before it fails (aws-ofi-nccl 1.x: the provider search, `Couldn't find any
        # optimal provider`, `OFI call failed with RC -61`, and ofi_init's own), named by its frame, NCCL's `func:line`
        r"|\b(?:(?:get|find)_ofi_provider|(?:nccl_net_)?ofi_init\w{0,40})(?:\([^)\n]{0,80}\))?:\d{1,6} "
        r"(?:NCCL|CCOM) WARN "
    ),
    (
        "retr",
        "skipping",
        "ignor",
        "fall",
        "suppress",
        "squelch",
        "not a failure",
        "instead",
        "warning: ",
        "ofi",
        "rescheduling",
        "[service thread] ",
        "skipped ",
        "non-fatal",
        "nonfatal",
        "ibv_open_device failed",
        "unable to open device",
        "no ip interface found",
        "failed to open lib",
        "initiating",
        "already handled",
        "resubmitting",
        "resend",
        "trial",
        "restarting",
        " logger",
        "failed to upload file",
        "failed to copy file",
        "disabling",
        ", attempting to use",
        ", trying to use",
        "will continue",
        "; dropping",
        "; deferring",
        "; leaking",
        "default",
        "optimal ",
        "reduced ",
        "degraded ",
        "checkpoint",
    ),
)
# Checkpoint markers: a checkpoint's start (or a line written while it is still being written: a shard, a file) and
# its end. A host whose newest marker is a start, with no other line since, is writing a checkpoint.
CHECKPOINT_START = "checkpoint_start"
CHECKPOINT_END = "checkpoint_end"
_FILE = r"[^\s'\"]{1,300}\.[A-Za-z0-9_]{1,16}\b"  # a file: a name with an extension
# the extensions weights are saved under (llama.cpp's train examples: `save_checkpoint_lora_file: saving to x.gguf`)
_WEIGHTS_FILE = r"(?:pt|pth|bin|safetensors|ckpt|pkl|msgpack|h5|npz|keras|gguf)"
# A save read by its structure: a verb of a closed list (its tense says whether the save goes on or is done), what it
# saves, and where. Saving verbs in progress; what is saved; the places a checkpoint goes. Removing old checkpoints is
# no save of its own: frameworks do it before a save (diffusers, Accelerate, mmengine's best) or after its end, in the
# background (Levanter, Orbax), so only a removal a framework logs as its save's last step marks one (`MARKERS`).
_SAVING = r"(?:[Ss]aving|[Ww]riting|[Ss]toring|[Uu]ploading|[Pp]ersisting|[Cc]ommitting|[Ff]inali[sz]ing)"
# (a state dict perhaps by its variable's name: PaddleNLP's `saving optimizer_state_dict process`)
_SAVED = (
    r"(?i:checkpoints?|ckpts?|snapshots?|(?:\w{1,20}_)?state(?:s|[ _]dicts?)?"
    r"|models?|weights|optimizers?|shards?|params)"
)
_CHECKPOINT_PLACE = rf"['\"]?[^\s'\"]{{0,200}}?(?:(?i:checkpoint|ckpt)|\.{_WEIGHTS_FILE}\b)"
# Words that make a line about a checkpoint something else than a save: loading, restoring or resuming one, a save
# (or a removal) still to come ("will be saved", Levanter's "We will delete it after saving a new checkpoint"), a save
# skipped (dlrover's `Skip saving the checkpoint from the memory to the storage.`), or said not made or stopped (vak's
# `Not saving max-val-acc checkpoint.`, dlrover's `Stop committing the checkpoint because the training processes
# restarted.`). A word inside a path or a file's name is part of a name (Lightning's `saving model to
# '/content/resume/epoch=3.ckpt'`, `.../epoch=3-restored.ckpt`), never what the line does.
_NOT_A_SAVE = re.compile(
    r"(?<![/\\=.-])\b(?i:load(?:s|ing|ed)?|restor(?:e|es|ing|ed)|resum(?:e|es|ing|ed)|init_from_ckpt)\b"
    r"(?![/\\=-]|\.\w)"
    r"|\b(?i:will) (?:be )?(?:saved|written|save|write|delete[sd]?)\b|\b(?i:not) (?:saving|writing)\b"
    r"|\b(?i:stop)(?:s|ped|ping)? (?:committing|saving|writing|persisting)\b"
    # a worker started that will save (dlrover's `Start a process to asynchronously save checkpoint.`, at start-up)
    r"|\b(?i:start)(?:s|ed|ing)? an? (?:process|thread|worker) to\b"
)
_NOT_A_SAVE_HINTS = ("load", "restor", "resum", "init_from", "will ", "not ", "stop", "start")
# A save skipped is none (dlrover's `Skip and only rank 0 saves checkpoint in a DDP job.`), unless the line says why:
# another one still going on (ms-swift's `Skip saving the checkpoint of step 500 because the latest checkpoint is not
# finished.`, while dlrover's flash checkpoint persists it). A persist or a write skipped is none either (dlrover's
# `Skip persisting the checkpoint of step 1000 because the cached step in memory are not consistent.`).
_SKIPPED = re.compile(
    r"\b(?i:skip(?:s|ped|ping)?)\b[^\n]{0,30}?\b(?i:sav(?:e|es|ing)|persist(?:s|ing)?|writ(?:e|es|ing))\b"
)
_STILL_SAVING = re.compile(r"\b(?:is|are) (?:saving|writing)\b|\bis not (?:yet )?(?:finished|completed?|done)\b")
MARKERS: tuple[Rule, ...] = (
    Rule(
        CHECKPOINT_END,  # the frameworks' own completion lines
        re.compile(
            r"\bCheckpoint \S{1,100} is ready now\b"  # DeepSpeed
            r"|[Ss]uccessfully saved checkpoint (?:at|from) iteration"  # Megatron-LM, NeMo
            r"|Finished saving (?:[\w-]{1,40} ){0,2}checkpoint"  # torchtitan, metaseq, Orbax, Levanter
            r"|[Cc]heckpoint save for step \d+ .{0,400}?finalized successfully"  # NeMo
            r"|PEFT modules are saved in"  # llama-recipes
            r"|\bNew (?:best )?\.nemo model saved to\b"  # NeMo: its .nemo copy, written once the checkpoint is
            r"|Deleting older checkpoint"  # Transformers Trainer: after every file of the new one is written
            r"|Global Checkpoint Save : "  # NeMo
            r"|Finished asynchronous save\b|Save Finalize is done\b"  # Orbax (its async save, its CheckpointManager)
            r"|\bSaved state to\b"  # Accelerate's save_state, as the diffusers and accelerate examples log it
            # a checkpoint said saved or published, in the passive: mmengine's best (`is saved to`), mmcv's (`is saved
            # as`), a published copy, torchtune's async save (`is saved asynchronously to ... successfully`)
            r"|\b(?i:checkpoint)\b[^\n]{0,160}? is (?:saved|published)(?: \w{1,20}ly)? (?:to|as|in|at)\b"
            # the checkpoint itself said saved to its place; one named by its part (torchtune's `Model checkpoint
            # saved to`, `Adapter checkpoint of size ... saved to`) is one part of it, a start
            r"|(?<!(?i:model) )(?<!(?i:recipe) )(?<!(?i:adapter) )\b(?i:checkpoint|ckpt|snapshot)s? (?:\w{1,20}ly )?"
            r"saved (?:to|in|at) "
            # torchtune's checkpointers: the recipe state is the last file of an intermediate checkpoint, and the final
            # epoch's note comes after every file of the last one
            r"|\bRecipe checkpoint of size [\d.]+ \w+ saved to |\bSaving final epoch checkpoint\.$"
            r"|\bCommit checkpoint tmp_path: "  # dlrover's flash checkpoint: its staged directory moved into place
            # every rank's part said saved (dlrover's `All agents finish saving checkpoint for step 1000`; one shard's
            # `Finish saving the checkpoint shard 0` is a part)
            r"|\b[Aa]ll (?:\w{1,20} ){1,2}finish(?:ed)? (?:saving|writing) (?:the )?(?i:checkpoint)\b(?! shard)"
            # the model said saved as the message's first words, printed bare: its one file is the whole save (cleanrl's
            # `model saved to runs/.../dqn.cleanrl_model`; a logger's part of a save names its place after a prefix)
            r"|^[Mm]odel saved (?:to|in|at) "
            # the thread or the wait a save ran in said over (Orbax's background thread, its finalize thread's waiter;
            # torchtune's wait for the previous one)
            r"|\b(?:[Ss]ave|[Cc]ommit) thread (?:\w{1,20} ){0,2}?(?:done|finished|joined)\b"
            r"|\b(?:[Dd]one (?:with )?waiting|[Ww]aited [\d.]+ \w{1,10}) for [^\n]{0,60}?(?i:save|checkpoint|upload)"
            # a save whose outcome the line ends on (GPT-SoVITS' `saving ckpt %s_e%s:%s`, its weights' saver returning
            # "Success." once the file is written, the last of the epoch's save)
            r"|\b[Ss]aving \S{1,20} \S{1,200}:Success\.$"
            # Accelerate's save_model, a whole save: its weights' one file or its shards' index written last
            r"|\baccelerate\.accelerator - "
            r"(?:Model weights saved in|The model is bigger than the maximum size per checkpoint)\b"
            # Ultralytics' and YOLOv5's final_eval strip last.pt, then best.pt: the last file of the final save
            r"|\bOptimizer stripped from \S{0,200}?\bbest\.pt\b"
        ),
        # every completion line names a save, the checkpoint, an upload, a commit or the stripped weights
        ("sav", "checkpoint", "upload", "commit", "stripped"),
    ),
    Rule(
        CHECKPOINT_START,  # the frameworks' own lines while a checkpoint is written: one of its files, a save begun
        re.compile(
            r"\[(?:Torch|Nebula)\] Sav(?:ing|ed) |zero checkpoint saved|Saving model checkpoint: "  # DeepSpeed
            r"|\bCheckpoint \S{1,100} is about to be saved"
            rf"|\b(?:[Cc]onfiguration|[Mm]odel weights|[Tt]okenizer config file|[Ss]pecial tokens file) saved in "
            rf"|\b(?:checkpoint|[Ss]tate dict|weights|optimizer|[Cc]onfig) of size [\d.]+ \w+ saved to "  # torchtune
            rf"|\bsaved (?:in|to) {_FILE}"
            r"|\.orbax-checkpoint-tmp\b|/checkpoint/write/|\[thread=async_save\]"  # Orbax: tmp dir, throughput, thread
            rf"|\bOptimizer stripped from {_FILE}"  # Ultralytics: the final weights rewritten without the optimizer
            r"|Pending async checkpoint saves|Checkpoint save for step \d+ started"  # NeMo
            r"|about to save the PEFT modules"  # llama-recipes
            r"|\bGetting (?:\w{1,20} ){0,2}state dict\b"  # llama-recipes', torchtune's: the states gathered to be saved
            # one rank's file said saved: one shard of the checkpoint (verl's `Saved optim to .../optim_..._rank_0.pt`)
            rf"|\b[Ss]aved (?:\w{{1,20}} )?to \S{{0,200}}?[_/-]rank_?\d{{1,5}}\.{_WEIGHTS_FILE}\b"
            r"|\b[Ss]taging the checkpoint\b"  # torchtitan's async save: its upload goes on after `Finished staging`
            # Transformers' and diffusers' save_pretrained, its shards' index written: the tokenizer, the optimizer and
            # the trainer's state still to come in a Trainer's save
            r"|\bsplit in \d{1,6} checkpoint shards\b"
            # a save that goes on in the background once its blocking part is done (Orbax's `Finished blocking save
            # ... Continuing save`, torchtune's `Saving asynchronous checkpoint took`), a checkpoint named by its part
            r"|\b[Cc]ontinuing (?:the )?(?:save|saving|writing|upload)\b|\b[Ss]aving async\w{0,7} checkpoint\b"
            r"|\b(?i:model|adapter|optimizer) checkpoint\b[^\n]{0,60}? saved (?:to|in|at) "
        ),
        (
            "sav",
            "writ",
            "upload",
            "orbax-checkpoint-tmp",
            "optimizer stripped from",
            "state dict",
            "staging the checkpoint",
            "checkpoint shards",
        ),
    ),
    Rule(
        CHECKPOINT_END,  # a save done: a past verb of the list with a checkpoint, or with where it went
        re.compile(
            # a checkpoint said done (perhaps "locally", "successfully"), finalised, or its listeners called after it
            # (its name's suffix a file's or a step's, never a class's: `CheckpointManager created` is no save), perhaps
            # by its tag or step (neuronx-distributed's `saving of checkpoint step_2000 completed`, fairseq2's
            # `Checkpoint at step 5000 saved.`)
            r"\b(?i:checkpoint|ckpt|snapshot)(?![A-Z][a-z])\S{0,40} "
            r"(?:(?:at |for |of )?(?:step |iteration )?\w{0,30}\d )?"
            r"(?:\w{1,20}ly |(?:save|saving|writing|uploading) )?"
            r"(?:saved|written|uploaded|committed|completed?|finished|created)\b"
            # one said to have been saved, however long the sentence (torchtune's `The full model checkpoint, including
            # all weights and configurations, has been saved successfully.`)
            r"|\b(?i:checkpoint|model)\b[^\n]{0,80}? (?:has|have) been (?:\w{1,20}ly )?(?:saved|written|uploaded)\b"
            # a save said finished, whatever its kind (Orbax's `Finished save in`, `Finished synchronous save.`)
            r"|\b[Ff]inished (?:\w{1,20} )?save\b"
            # a save said to have succeeded, in any tense (a small trainer's "successfully save the model to ...")
            r"|\b(?i:successfully) (?:save[ds]?|wrote|written|uploaded|committed)\b"
            # a save said done by its bare verb behind Paddle's `name LEVEL: ` layout, or after "Already", its object
            # the model or the checkpoint (PaddleOCR's `save model in`, `save best model is to`, PaddleClas' `Already
            # save model in`, PaddleDetection's `Save checkpoint: <dir>`: each logged once every file of it is written)
            r"|(?:\b[Aa]lready |\b[A-Z]{4,8}: )[Ss]ave (?:(?:best )?models? (?:is to|in)|checkpoint:) "
            # an old checkpoint's files listed as removed, the last step of a save that keeps the newest few (ESPnet's
            # `were removed: ...`, NeMo's `Removed checkpoint: ...`); a removal told as a sentence is a background
            # purge that may run while the next save is written (torchtitan's, Megatron-LM's)
            rf"|\b(?:[Rr]emoved|[Dd]eleted)(?: (?:\w{{1,20}} )?(?i:checkpoints?))?: {_CHECKPOINT_PLACE}"
            r"|\b(?i:checkpoint|save)\w{0,20} (?:\w+ ){0,3}?finali[sz]ed\b"
            rf"|\bafter (?:saving|writing) (?:\w+ ){{0,2}}?{_SAVED}\b"
            r"|\b(?:Saved|Finished (?:saving|writing)|Wrote|Uploaded|Committed|Finali[sz]ed) (?:the )?(?:\w+ ){0,2}?"
            r"(?i:checkpoints?|ckpts?|snapshots?)\b"
            # a model said saved, perhaps by what it is (detectron2's best checkpointer: `Saved best model as ...`)
            r"|\b(?:Saved|[Ff]inished (?:saving|writing)|Wrote|Uploaded) (?:the )?(?:\w{1,20} )?(?i:models?) "
            r"(?:to|at|in|for|as)\b"
            # the model, its weights or its adapter said saved at a place or a time (ShivamShrirao's dreambooth
            # `[*] Weights saved at <dir>`, TheLastBen's `Intermediary LoRA saved at epoch 3`); a weights file the
            # object of the past verb (pytorch/examples' FSDP `--> saved <dir>/optimizer-t5-small-0.pt to disk`)
            r"|\b(?:[Ww]eights|[Mm]odels?|LoRA|[Aa]dapters?) saved at\b"
            rf"|\b(?:[Ss]aved|[Ww]rote|[Uu]ploaded) ['\"]?[^\s'\"]{{0,200}}?\.{_WEIGHTS_FILE}\b"
            # every file of it said saved (DeepSpeed's Nebula engine: `all files for global_step10 are saved in tier1`)
            r"|\b[Aa]ll (?:\w{1,20} )?files\b[^\n]{0,60}? (?:are|were|have been) (?:saved|written)\b"
            rf"|\b(?:Saved|[Ff]inished saving|Wrote|Uploaded) (?:\S{{1,60}} ){{0,3}}(?:to|at|in|into) "
            rf"{_CHECKPOINT_PLACE}"
            # how long the save took, said once it is done (metaseq's "(writing took 1.2 seconds)", torchtune's)
            r"|\b(?:[Ss]av(?:e|ing)|[Ww]rit(?:e|ing))\b[^\n]{0,40}?\btook [\d.]+"
            # what was saved said saved as the message's last words (a rich console's `file.py:123` after them)
            r"|\b(?i:models?|weights|state dicts?) (?:\w{1,20}ly )?saved\.?(?:\s{2,}[\w.-]{1,80}:\d{1,6})?\s*$"
        ),
        (
            "checkpoint",
            "ckpt",
            "snapshot",
            "sav",
            "writ",
            "wrote",
            "upload",
            "commit",
            "finali",
            "removed",
            "deleted",
            *(f"{noun} {to}" for noun in ("model", "models") for to in ("to", "at", "in", "for")),
        ),
    ),
    Rule(
        CHECKPOINT_START,  # a save going on: a verb of the list in progress, what it saves or where, or a save begun
        re.compile(
            rf"\b{_SAVING} (?:[\w'\"-]{{1,40}} ){{0,3}}?{_SAVED}\b"
            rf"|\b{_SAVING} (?:\S{{1,60}} ){{0,3}}?(?:to|in|into|at) {_CHECKPOINT_PLACE}"
            # a weights file the object of the verb (OpenNMT-py's `Saving safetensors run/model_step_10.pt`)
            rf"|\b{_SAVING} (?:\w{{1,40}} )?['\"]?[^\s'\"]{{0,200}}?\.{_WEIGHTS_FILE}\b"
            r"|\b(?:[Aa]bout|[Pp]reparing) to (?:save|write)\b|\bbefore (?:saving|writing|(?i:checkpoint)(?:ing)?)\b"
            # a checkpoint being prepared, or its save opening the sentence after it (fairseq2's `Preparing checkpoint
            # at step 5000.`, `Checkpoint prepared. Saving.`)
            r"|\b[Pp]reparing (?:the |a )?(?i:checkpoint)\b|\b(?i:checkpoint)\b[^\n]{0,30}?\. (?:Saving|Writing)\b"
            # a save announced by its bare verb opening the line, with what and where (kohya's `save trained model as
            # StableDiffusion checkpoint to ...`)
            rf"|^(?:[Ss]ave|SAVE) (?:[\w'\"-]{{1,40}} ){{0,5}}?(?:to|in|into|at) {_CHECKPOINT_PLACE}"
            # or after a logger's prefix, what it saves and perhaps the form it takes (kohya's `save trained model as
            # Diffusers to <dir>`, `save train state to <file> at epoch 3`)
            rf"|\bsave (?:[\w-]{{1,40}} ){{0,2}}?{_SAVED} (?:as (?:[\w-]{{1,40}} ){{1,2}})?(?:to|into) "
            # a save or a backup of the run printed bare with where it goes, a path alone (OneTrainer's `Saving
            # workspace/run/save/...`, `Creating Backup workspace/run/backup/...`)
            rf"|^(?:{_SAVING}|[Cc]reating (?:a )?[Bb]ackup) ['\"]?[\w.~:-]{{0,100}}[/\\][^\s'\"]{{0,200}}['\"]?\s*$"
            # a step announced as a save's (vak's `Step 4000 is a checkpoint step.`, its save right after)
            r"|\bis an? (?i:checkpoint|save) step\b"
            # a save, its commit (never a revision's) or its finalisation begun or scheduled (Orbax's `Starting commit
            # to storage layer`, `Beginning async checkpoint finalize.`, dlrover's `Start commit checkpoint`,
            # Megatron-LM's `takes 0.51 to schedule async ckpt`)
            r"|\b(?:[Ss]tart(?:ing|ed)?|[Bb]egin(?:ning|s)?|[Ss]chedul(?:e|ed|ing))\b[^\n]{0,40}?"
            r"\b(?i:sav(?:e|ing)|commit(?:ting)? (?:to|(?:the )?checkpoint)|ckpt|finali[sz]e)\b"
            r"|\b[Ss]tart(?:ing|ed)? (?:a |the )?(?i:checkpoint)(?:ing)? (?:for|of|at)\b"  # DeepSpeed's Nebula
            # a save announced by its bare verb, what it saves and a path (YOLOX's `Save weights to ./YOLOX_outputs/x`,
            # perhaps behind loguru's colour code, a Windows path)
            rf"|(?:\b|(?<=\dm))(?:Save|SAVE) (?:[\w'\"-]{{1,40}} ){{0,2}}?{_SAVED} (?:to|in|into|at) "
            r"['\"]?[^\s'\"]{0,200}?[/\\]"
            # a save still going on, said by who waits for it, or by a part of it written (Orbax's commit, metadata)
            r"|\b[Ww]aiting for (?:the )?(?:\S{1,40} ){0,3}?(?i:save|checkpoint|upload)"
            r"|\b(?i:checkpoint|save)\w{0,10} (?:has|is) not (?:yet )?(?:finished|completed?|done)\b"
            r"|\bfor (?:the )?(?i:checkpoint(?:ing)?|sav(?:e|ing)) to (?:finish|complete)\b"
            r"|\b(?i:save|checkpoint)\b[^\n]{0,40}? is syncing\b|\b(?i:metadata|shards?)\b[^\n]{0,30}? written\b"
            # one of a checkpoint's parts said saved: its model, optimizer, scheduler, state or weights
            r"|\b(?i:model|optimizer|scheduler|state|weights)\b[^\n]{0,40}? saved (?:to|in) "
            # a verb in capitals, perhaps behind a terminal colour code (TheLastBen's `\x1b[1;32mSAVING CHECKPOINT...`)
            rf"|(?<![A-Z])(?:SAVING|WRITING) (?:[\w'\"-]{{1,40}} ){{0,3}}?{_SAVED}\b"
            # a save in the present tense, or bound for the storage, the disk or memory (dlrover's flash checkpoint:
            # `Saves the checkpoint shard 0 ... into the storage`, `ShardingSaver save checkpoint to storage`, `the
            # agent persists checkpoint`; Orbax's `Finished committing to storage layer`)
            rf"|\b(?:[Ss]aves|[Ww]rites|[Pp]ersists) (?:the |a )?{_SAVED}\b"
            rf"|\b(?i:sav(?:e|es|ing)|writ(?:e|es|ing)|persist(?:s|ing)?)\b[^\n]{{0,40}}?{_SAVED}\b[^\n]{{0,40}}? "
            r"(?:to|into|in) (?:the )?(?:shared )?(?:storage|disk|memory)\b"
            r"|\b[Cc]ommit(?:s|ting)? to (?:the )?storage\b"
            # a saver said busy writing to the storage (dlrover's `Saver is writing to storage, waiting...`), every
            # agent's shard done with the commit still to come (dlrover's `All agent done for step <ckpt staging dir>`),
            # a step of a save said at its sentence's end (Accelerate's `Removed shared tensor {...} while saving.`)
            r"|\b(?:is|are) (?:saving|writing|persisting) (?:\w{1,20} ){0,2}?(?:to|into) (?:the )?(?:storage|disk)\b"
            r"|\b[Aa]ll \w{1,20} done for step \S{0,200}?ckpt|\bwhile saving\.(?: |$)"
            # a step of a save timed while it goes on (Megatron-LM: `takes 2.1 to prepare state dict for ckpt`, its
            # fully parallel strategy's `parallel save sharding, time: 0.43`, `Apply save parallelization`, its async
            # writer's `write(sync,parallel): 39.5`, `write(async) time: 12.3`, `metadata_write: 0.12`, its workers
            # started and their results collected, one rank's share done before the finalisation; dlrover's `execute
            # save_to_memory in 0.53s`), a state made ready for it (fairseq's `State of TranslationTask is ready to be
            # persisted with the checkpoint`), or saves left unfinalized and finalised now (Megatron-LM's `Unfinalized
            # async checkpoint saves.`)
            r"|\btakes [\d.]+\S{0,3} to (?:[\w-]{1,20} ){1,5}?(?i:ckpt|checkpoint|save)\b"
            r"|\b(?:[Ss]ave|ckpt) (?:shard|parallel)\w{0,10}\b"
            r"|\b(?:metadata_write|write\([\w,]{1,30}\)(?: time)?): [\d.]+"
            r"|Writer\w{0,10}: (?:main worker started|collect(?:ing|ed) worker results)"
            r"|(?:^|[:,]) ?(?:rank:? )?\d{1,6} has completed (?:saving|writing)\b"
            r"|\bexecute (?:\w{1,30}_)?save(?:_\w{1,30})? in [\d.]+"
            r"|\b(?:is|are) ready to be (?:persisted|saved|written)\b|\b[Uu]nfinali[sz]ed\b[^\n]{0,30}? saves?\b"
        ),
        (
            "sav",
            "writ",
            "storing",
            "upload",
            "persist",
            "commit",
            "finali",
            "checkpoint",
            "ckpt",
            "backup",
        ),
    ),
)

# CloudWatch Logs' regex subset (Filter pattern syntax: alphanumerics, these symbols and operators, no parentheses).
FILTER_REGEX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_#=@/;,-^$?[]{}|\\*+.")
FILTER_PATTERN_MAX = 1024  # characters, CloudWatch Logs API reference (FilterLogEvents, PutSubscriptionFilter)
# Needles (CloudWatch regexes), one of which every fatal line the rules name contains; `.` stands for a space or any
# character CloudWatch's regex cannot hold. Case-sensitive, like CloudWatch. Wider than the rules on purpose: a line
# that says something failed reaches the engine's tail reads even when no rule names it, and a word's first letter is
# dropped where its case varies (`xception`), to keep the pattern within CloudWatch's 1,024 characters.
FATAL_NEEDLES: tuple[str, ...] = (
    # severity marks, and what an error line says went wrong: the structural rule's words, and most families' too
    "ERR",
    "[Ee]rr",
    "FATAL|[Ff]atal",
    "CRITICAL",
    "[Ff]ail|FAIL",
    "bort|BORT",
    "erminat|TERM_",
    "[Kk]ill|KILL",
    "died|[Dd]ead",
    "ime.?.?[Oo]ut|IMEOUT",
    "xhaust|XHAUST|xceed|XCEED",
    "xception",
    "efused",
    "[Ll]ost",
    "[Cc]rash|[Pp]anic|nvalid|nexpected",
    "[Cc]an.?.?t|[Cc]ould.?n.t|not.available|not.found|[Uu]nable",
    "ncompatib|ismatch|nrecoverab",
    # storage, Kubernetes, the shell, systemd
    "ead-only|No.space",
    "Evicted|on.resource|reempted",
    "core.dumped|:.line.[0-9]",
    "status=[1-9]",
    # MPI's help text, a libfabric call's negative errno, sacct's states
    "MPI.job|Returned",
    "fi_[a-z]+:.-[0-9]|ret=-",
    "OUT_OF_ME|PREEMPT",
    # NCCL and its transport, the Neuron collectives, EFA
    "[LM].WARN",  # NCCL WARN, CCOM WARN (and RCCL WARN)
    "atchdog",
    "lack.of",  # an application's watchdog: `due to lack of heartbeats`
    "ess.down",
    "[ye].peer",
    "NET/OFI",
    "efa.0000",  # the EFA kernel driver's PCI frame
    "to.EQ",
    ":cq:",
    # CUDA, the driver, the kernel
    "llegal.m",
    "device-side",
    "_STATUS_[A-Z]",
    "ut.[Oo]f.[Mm]emory|OOM",
    "Xid",
    "llen.off",
    "oom[-_][kr]",
    "egmentation|segfault",
    "SIG[A-Z]",
    "ignal.[0-9]|[dh].signal|Signal:",  # signal 9, Signal 11, received signal, death signal, Signal: Bus error
    "BACKTRACE",
    "what..:",
    "orrupt|etected|virtual.m|@.+0x",  # glibc's and libstdc++'s aborts, the failure signal handlers' PC line, frames
    # the Neuron runtime, XLA's status codes
    "NRT|[Nn]rt|TDRV|MGR|NEFF|NVRM",
    "RNAL:|VAILABLE:|_LOSS|StatusOr|Non-OK",  # INTERNAL:, UNAVAILABLE:, DATA_LOSS, TF_CHECK_OK's `Non-OK-status: `
    # launchers and schedulers
    # exit code, exitcode, exit status, exited with (code), exited code, exiting now, bhist's `Exited; job ...`
    "[Ee][Xx][Ii][Tt].?.?.?.?[CcSsWwnj][OoTtIi]",
    "return.code",
    "d..code",  # run.pl's `# Ended (code 1)`
    "CANCELLED",
    "nhealthy",  # ParallelCluster's unhealthy nodes set DOWN
    "srun:|salloc:|sbatch:",
    "Exited$",
    "WTERMSIG",
    "non-zero",
    "BAD.TERM",
    "CLEANING",
    ".137",
    # Python
    "recent.call",
)
CHECKPOINT_NEEDLES: tuple[str, ...] = (
    "[Cc]heckpoint",
    "CHECKPOINT",
    "[Cc]kpt",
    "[Ss]napshot",
    "[Bb]ackup",
    # the save verbs of `MARKERS`, in progress and done
    "[Ss]av[ei]",
    "[Ww]rit[it]|[Ww]rote",
    "[Ss]tor[ie]",
    "[Uu]pload",
    "[Pp]ersist",
    "[Cc]ommit",
    "[Ff]inali[sz]",
    "[Rr]emoving|[Dd]eleting|[Pp]runing|[Cc]leaning.up|[Rr]emoved|[Dd]eleted",
    "state.dict",
    "stripped.from",
)


# A Python escape as CloudWatch takes it: the digit class and escaped operators as they are, a word boundary dropped
# (a wider match), any other class widened to any character.
_FILTER_ESCAPES = {"d": r"\d", "b": "", "B": "", **{c: "\\" + c for c in ".[]{}|*+?^$\\-"}}


def filter_regex(pattern: str) -> str:
    """`pattern` (a Python regex) as CloudWatch would take it, widened where its syntax is narrower: a literal
    character CloudWatch's regex cannot hold (a space, a quote, an escaped parenthesis) becomes `.`. Raises ValueError
    for a construct it cannot widen (a group, a lookaround, a backreference)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt.isdigit():
                raise ValueError("backreferences cannot go into a CloudWatch filter pattern")
            out.append(_FILTER_ESCAPES.get(nxt, nxt if nxt in FILTER_REGEX_CHARS and not nxt.isalpha() else "."))
            i += 2
            continue
        if c in "()":
            raise ValueError("groups (parentheses) cannot go into a CloudWatch filter pattern")
        if c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                raise ValueError("unterminated character class")
            body = pattern[i + 1 : end]
            out.append(f"[{body}]" if set(body) <= FILTER_REGEX_CHARS else ".")
            i = end + 1
            continue
        out.append(c if c in FILTER_REGEX_CHARS else ".")
        i += 1
    return "".join(out)


def filter_pattern(needles: Iterable[str]) -> str:
    """A CloudWatch Logs filter pattern keeping the lines that hold any of the needles (one ``%regex%``)."""
    return "%" + "|".join(needles) + "%"


def fatal_filter_pattern(extra: Iterable[str] = ()) -> str:
    """The subscription filter's pattern: the built-in fatal lines plus these regexes (a policy's own, widened into
    CloudWatch's subset by `filter_regex`)."""
    return filter_pattern((*FATAL_NEEDLES, *(filter_regex(p) for p in extra)))


def passes_fatal_filter(message: str, pattern: str | None = None) -> bool:
    """Whether CloudWatch Logs delivers `message` under the subscription filter `pattern` (the built-in one unless
    given: `fatal_filter_pattern(extra)`, `Policy.fatal_filter_pattern`)."""
    return filter_keeps(pattern or FATAL_FILTER_PATTERN, message)


def filter_keeps(pattern: str, message: str) -> bool:
    """Whether CloudWatch Logs keeps `message` under the ``%regex%`` filter `pattern` (unanchored, case-sensitive)."""
    return _compiled_filter(pattern).search(message) is not None


_FILTERS: dict[str, re.Pattern[str]] = {}


def _compiled_filter(pattern: str) -> re.Pattern[str]:
    if pattern not in _FILTERS:
        _FILTERS[pattern] = re.compile(pattern.strip()[1:-1])
    return _FILTERS[pattern]


@dataclass(frozen=True)
class LinePatterns:
    """The built-in rules and markers, plus a policy's own (`extended`): what names a line, and what CloudWatch Logs
    is asked for. The user's lines come after the built-in ones (a line the built-ins name keeps their kind)."""

    fatal: tuple[re.Pattern[str], ...] = ()
    checkpoint_start: tuple[re.Pattern[str], ...] = ()
    checkpoint_end: tuple[re.Pattern[str], ...] = ()
    fatal_filter: str = field(default="")
    checkpoint_filter: str = field(default="")

    @classmethod
    def extended(
        cls, fatal: Iterable[str] = (), checkpoint_start: Iterable[str] = (), checkpoint_end: Iterable[str] = ()
    ) -> LinePatterns:
        """The built-ins plus these regexes (validated by the policy: they compile, are linear and fit the filter)."""
        fatal, starts, ends = tuple(fatal), tuple(checkpoint_start), tuple(checkpoint_end)
        return cls(
            fatal=tuple(re.compile(p) for p in fatal),
            checkpoint_start=tuple(re.compile(p) for p in starts),
            checkpoint_end=tuple(re.compile(p) for p in ends),
            fatal_filter=fatal_filter_pattern(fatal),
            checkpoint_filter=filter_pattern((*CHECKPOINT_NEEDLES, *(filter_regex(p) for p in (*starts, *ends)))),
        )

    def match(self, message: str) -> str | None:
        """The fatal kind of the first rule `message` matches, or None for an ordinary line."""
        low = message.lower()
        hits = _cover_hits(low)
        return self._match(message, low, _candidates(hits)) if hits else self._user_fatal(message)

    def _match(self, message: str, low: str, candidates: _Candidates) -> str | None:
        # a line that goes on, or a platform probe's failure logged and not raised, whatever rule would name it
        if SURVIVES.search(message, low) or log_structure.probe(message, low):
            return self._user_fatal(message)
        quiet: bool | None = None  # whether the line's level is low, looked up once if a strict rule asks
        for rule in candidates.rules:
            if rule.search(message, low):
                if rule.name == XID:
                    return XID if _xid_fatal(message) else None
                if rule.name == EFA and log_structure.libfabric_low(message):
                    continue
                if rule.strict:
                    quiet = log_structure.quiet(message) if quiet is None else quiet
                    if quiet:
                        continue
                return _named(message) if rule.name == ERROR_LINE else rule.name
        if candidates.may_fail and log_structure.fatal_by_structure(message, low):
            return _named(message)
        return self._user_fatal(message)

    def _user_fatal(self, message: str) -> str | None:
        if not self.fatal:
            return None
        return USER_FATAL if any(p.search(message) for p in self.fatal) else None

    def marker(self, message: str) -> str | None:
        """CHECKPOINT_START or CHECKPOINT_END for a checkpoint's start (or in-progress) or end line, else None (ask
        `match` first: a fatal line is never a marker)."""
        low = message.lower()
        return self._marker(message, low, _candidates(_cover_hits(low)))

    def _marker(self, message: str, low: str, candidates: _Candidates) -> str | None:
        if any(p.search(message) for p in self.checkpoint_end):
            return CHECKPOINT_END
        if any(p.search(message) for p in self.checkpoint_start):
            return CHECKPOINT_START
        for rule in candidates.markers:
            if rule.search(message, low):
                return None if _not_a_save(message, low) else rule.name
        return None

    def classify(self, message: str) -> tuple[str | None, str | None]:
        """(fatal kind, checkpoint marker) of a line; (None, None) for the ordinary ones, and for the agent's stack
        dump (its frames may name a checkpoint or a kill)."""
        if STACKS_MARKER in message:
            return None, None
        low = message.lower()
        hits = _cover_hits(low)
        candidates = _candidates(hits)
        pattern = self._match(message, low, candidates) if hits else self._user_fatal(message)
        return pattern, None if pattern else self._marker(message, low, candidates)

    @property
    def filter_patterns(self) -> tuple[str, str]:
        """FilterLogEvents' filter patterns for the notable lines, one call each: the fatal lines, the markers."""
        return self.fatal_filter or FATAL_FILTER_PATTERN, self.checkpoint_filter or CHECKPOINT_FILTER_PATTERN


# Short phrases one of which every phrase of every gate holds (tests/core/test_log_patterns.py checks it): a line
# holding none of them is ordinary without a look at any rule (most lines of a training log: its steps and losses),
# and a line holding some is read only by the rules whose gates hold one of those (`_candidates`).
COVER: tuple[str, ...] = (
    "err", "fail", "kill", "sig", "sav", "exit", "nccl", "cuda", "checkpoint", "ckpt", "model", "abort", "terminat",
    "timeout", "timed out", "illegal", "out of memory", "connection", "recv", "completion", "watchdog", "heartbeat",
    "process down", "ofi", "fi_", "socket", "rendezvous", "xid", "bus", "device-side", "_status", "oom", "exceeded",
    "seg", "cancelled", "srun:", "preempted", "refused", "primary job", "non-zero", "cleaning up", "lost",
    "sagemaker-", "return code", "137", "traceback", "backtrace", "most recent call",
    "exception", "ready now", "successfully", "state dict",
    # the verbs a save is read by (`MARKERS`)
    "writ", "wrote", "storing", "upload", "persist", "commit", "finali", "remov", "delet", "prun", "snapshot", "backup",
    # the Neuron runtime and collectives, XLA's status codes, Ray, Slurm's tools, LSF, libfabric
    "nrt", "ccom", "statusor", "internal: ", "unavailable: ", "data_loss", "data loss", "died", "dead", "slurm",
    "salloc:", "sbatch:", "term_", "libfabric", "ray.train.", ", ret=-",
    # the marks that are fatal alone, and the failure words of `log_structure` no phrase above holds (an ERROR line
    # holds "err" already)
    "fatal", "critical", "exhaust", "could not", "couldn't", "cannot", "can't", "unable", "invalid", "unexpected",
    "crash", "panic", "not found", "not retrying",
    # libstdc++'s uncaught exception, Ultralytics' final weights
    "what()", "stripped",
    # storage's errno messages, a pod's eviction, the shell's signal report, a scheduler's time limit, run.pl's exit
    "read-only", "no space left", "evicted", "the node", "core dumped", ": line ", "timed-out", "(code",
    # Open MPI's banner and help text, PSM, sacct's states
    "your mpi job", "--> returned", "psm", "out_of_me",
    # glibc's and libstdc++'s abort messages, the failure signal handlers' PC line and frames; the Neuron runtime's
    # components and NEFF, the NVIDIA driver's tag (a device runtime's refusal to start, `log_structure`); the EFA
    # driver's PCI frame
    "alloc(): ", "malloc", "free(): ", "chunk", "corrupt", "tcache", "virtual method", "pc: @", "@ ", "tdrv", "mgr",
    "nvrm", "neff", "efa 0000:",
)  # fmt: skip


class _Candidates(NamedTuple):
    """The rules and markers a line holding some phrases of COVER may match, in their order, and whether it may say
    something failed (`log_structure`'s failure words, or a fatal mark: the structural reading runs only then)."""

    rules: tuple[Rule, ...]
    markers: tuple[Rule, ...]
    may_fail: bool


def _covering(rules: tuple[Rule, ...]) -> tuple[tuple[Rule, frozenset[str]], ...]:
    """Each rule with the phrases of COVER its gate's phrases hold."""
    return tuple((rule, frozenset(c for c in COVER if any(c in phrase for phrase in rule.gate))) for rule in rules)


_RULES_COVERED = _covering(RULES)
_MARKERS_COVERED = _covering(MARKERS)
# The phrases of COVER the failure words and the fatal marks hold: a line holding none of them says nothing failed.
_FAILURE_COVER = frozenset(c for c in COVER if any(c in word for word in (*log_structure.FAILURE_HINTS, "critical")))


def _cover_hits(low: str) -> tuple[str, ...]:
    """The phrases of COVER the lowercased line holds, in COVER's order (none: no rule's gate lets it through)."""
    return tuple([phrase for phrase in COVER if phrase in low])


@lru_cache(maxsize=1024)
def _candidates(hits: tuple[str, ...]) -> _Candidates:
    """The rules and markers whose gates a line holding these phrases of COVER may pass (a few hundred distinct sets
    in real logs, so remembered)."""
    found = frozenset(hits)
    return _Candidates(
        tuple(rule for rule, covered in _RULES_COVERED if covered & found),
        tuple(rule for rule, covered in _MARKERS_COVERED if covered & found),
        bool(found & _FAILURE_COVER),
    )


def _not_a_save(message: str, low: str) -> bool:
    """Whether a line a marker names is about loading, restoring or resuming a checkpoint, a save still to come, or a
    save skipped while none goes on."""
    if "skip" in low and _SKIPPED.search(message) and not _STILL_SAVING.search(message):
        return True
    return any(hint in low for hint in _NOT_A_SAVE_HINTS) and _NOT_A_SAVE.search(message) is not None


def _named(message: str) -> str:
    """A line fatal by its structure (or by a signature that names no family), named by the family its words name."""
    return next((kind for kind, words in _FAMILIES if words.search(message)), ERROR_LINE)


def survives(message: str) -> bool:
    """Whether a line says the job goes on (a retry, a skipped batch, an ignored exception, a fallback, a Python
    warning): benign by itself, whatever error it quotes; the engine may take it as the end of a harmless block."""
    return SURVIVES.search(message, message.lower())


def _xid_fatal(message: str) -> bool:
    """Whether an Xid line reports a death (NVIDIA's catalogue): not an informational code, not a non-fatal NVLink
    event. A line naming no code ("GPU has fallen off the bus") is one."""
    found = _XID.search(message)
    if not found:
        return True
    code = int(found.group(1))
    if code in XID_INFORMATIONAL:
        return False
    return not (code in XID_NVLINK and _NVLINK_NONFATAL.search(message))


# The subscription filter's pattern (fatal lines alone), the markers', and FilterLogEvents' (both, one call each).
FATAL_FILTER_PATTERN = fatal_filter_pattern()
CHECKPOINT_FILTER_PATTERN = filter_pattern(CHECKPOINT_NEEDLES)
FILTER_PATTERNS: tuple[str, str] = (FATAL_FILTER_PATTERN, CHECKPOINT_FILTER_PATTERN)
BUILT_IN = LinePatterns()
# The trainer agent's EMF document (trainer_agent.emf) opens with its "_aws" metadata.
AGENT_WINDOW_PREFIX = '{"_aws"'


def match(message: str) -> str | None:
    """The built-in fatal kind of `message`, or None for an ordinary line."""
    return BUILT_IN.match(message)


def marker(message: str) -> str | None:
    """The built-in checkpoint marker of `message` (see `LinePatterns.marker`)."""
    return BUILT_IN.marker(message)


def classify(message: str) -> tuple[str | None, str | None]:
    """(fatal kind, checkpoint marker) of a line by the built-in rules."""
    return BUILT_IN.classify(message)


def notable(message: str) -> bool:
    """Whether the server-side filters keep `message` (a superset of the fatal and marker lines)."""
    return any(filter_keeps(pattern, message) for pattern in FILTER_PATTERNS)


def agent_window(message: str) -> bool:
    """Whether `message` is one of the trainer agent's own lines, its EMF window or its stack dump (its stdout sink):
    the agent's threads speak, not the training loop, so they say nothing of what the loop does."""
    return message.startswith(AGENT_WINDOW_PREFIX) or STACKS_MARKER in message
