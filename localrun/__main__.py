"""``python -m localrun``: the whole product on this machine, on moto, in under three minutes.

    python -m localrun                      # the default: an NCCL-style hang, stopped
    python -m localrun --platform ec2       # the hang on a 2-instance EC2 cluster: one StopInstances for both
    python -m localrun --scenario checkpoint
    python -m localrun --scenario crash --json > result.json
    python -m localrun --scenario hang --resume   # stopped, resumed as <job>-r1 from its checkpoint, goodput report
    python -m localrun --platform ec2 --scenario hang --recover restart   # health checks, restart in place
    python -m localrun --platform ec2 --scenario xid --recover restart    # the node with Xid 79 taken out
    python -m localrun --platform slurm --scenario hang    # a real Slurm (make slurm): the 2-node job scancel'd
    python -m localrun --platform slurm --scenario crash --recover requeue   # the crashed node drained, job requeued

Exit code 0 only if the scenario's expected outcome happened; 130 after Ctrl-C (everything is cleaned up).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from rich.console import Console

from localrun import request_log
from localrun.run import LocalRun
from localrun.scenarios import (
    DEFAULT_SCENARIO,
    RECOVER_DEADLINE_S,
    RESUMABLE_SCENARIOS,
    RESUME_DEADLINE_S,
    RUN_DEADLINE_S,
    SCENARIOS,
)
from localrun.slurm_run import SlurmRun
from localrun.summary import summary_table
from stallwatch.core.signals import Platform
from stallwatch.offline.report import goodput_table

EXIT_INTERRUPTED = 130
LOG_WIDTH = 120
# stallwatch:recover: as without recovery, in place (EC2), or requeued off the bad node (Slurm)
RECOVER_MODES = ("stop", "restart", "requeue")
SLURM_SCENARIOS = ("hang", "crash", "idle")  # a 2-node job: a one-host scenario's fault on both nodes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m localrun", description="The whole product on this machine, on moto, in under three minutes."
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default=DEFAULT_SCENARIO,
        help="; ".join(f"{s.name}: {s.summary}" for s in SCENARIOS.values()).replace("%", "%%"),  # argparse formats
    )
    parser.add_argument(
        "--platform",
        type=Platform,
        choices=list(Platform),
        default=Platform.SAGEMAKER,
        help="a SageMaker training job, an EC2 cluster (instances tagged stallwatch:job, at least 2), or a 2-node "
        "job on a real 3-node Slurm on this machine (`make slurm` installs it)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout (the view on stderr)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="the job opts in to a restart from its checkpoint: Stallwatch resumes it after the stop "
        "(hang and crash), and the run ends with its goodput report",
    )
    parser.add_argument(
        "--record-requests",
        type=Path,
        metavar="DIR",
        help="write every AWS request the run makes (this process and the training processes) to DIR as JSON "
        "Lines, for tests/e2e/test_demo.py's check of AWS's documented limits",
    )
    parser.add_argument(
        "--recover",
        choices=RECOVER_MODES,
        default="stop",
        help="EC2: restart tags the job stallwatch:recover=restart: a stall Stallwatch would stop is health-checked "
        "node by node through SSM and restarted in place from its checkpoint (hang, crash, xid), a bad node taken out; "
        "Slurm: requeue tags the job stallwatch:recover=requeue: the job is requeued (the nodes a hardware signal "
        "blames drained first, never one for a rank's own error), which Slurm runs again from its checkpoint",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        help=f"fail after this many seconds (default {RUN_DEADLINE_S:.0f}, with --resume {RESUME_DEADLINE_S:.0f})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.resume and not SCENARIOS[args.scenario].resumable:
        parser.error(
            f"--resume: Stallwatch resumes only {', '.join(sorted(RESUMABLE_SCENARIOS))} (not {args.scenario})"
        )
    if args.resume and args.platform is Platform.EC2:
        parser.error("--resume: the local run resumes SageMaker jobs only")
    recover = args.recover == "restart"
    requeue = args.recover == "requeue"
    if recover and args.platform is not Platform.EC2:
        parser.error("--recover restart: recovery in place is for EC2 clusters (add --platform ec2)")
    if requeue and args.platform is not Platform.SLURM:
        parser.error("--recover requeue: a requeue is a Slurm job's recovery (add --platform slurm)")
    if (recover or requeue) and not SCENARIOS[args.scenario].resumable:
        parser.error(
            f"--recover {args.recover}: recovers {', '.join(sorted(RESUMABLE_SCENARIOS))} (not {args.scenario})"
        )
    if args.platform is Platform.SLURM and args.scenario not in SLURM_SCENARIOS:
        parser.error(f"--platform slurm: runs {', '.join(SLURM_SCENARIOS)} (not {args.scenario})")
    if args.platform is Platform.SLURM and args.resume:
        parser.error("--resume: a Slurm job is requeued instead (--recover requeue)")
    slow = recover or requeue
    default_deadline = RECOVER_DEADLINE_S if slow else RESUME_DEADLINE_S if args.resume else RUN_DEADLINE_S
    deadline = args.deadline or default_deadline
    interrupted = threading.Event()

    def _interrupt(signum: int, frame: FrameType | None) -> None:
        """Ctrl-C and SIGTERM unwind, so every cleanup runs; the flag ends the run even if a library swallows
        the KeyboardInterrupt (it may arrive inside a handler's AWS call)."""
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    stream = sys.stderr if args.json else sys.stdout
    # Off a terminal (CI, a pipe) rich assumes 80 columns; the timeline reads better wider.
    console = Console(file=stream, highlight=False, width=None if stream.isatty() else LOG_WIDTH)
    try:
        scenario = SCENARIOS[args.scenario]
        if args.platform is not Platform.SAGEMAKER:
            scenario = scenario.as_cluster()
        run: LocalRun | SlurmRun
        if args.platform is Platform.SLURM:
            run = SlurmRun(scenario, console, deadline_s=deadline, interrupted=interrupted, requeue=requeue)
        else:
            run = LocalRun(
                scenario,
                console,
                deadline_s=deadline,
                interrupted=interrupted,
                resume=args.resume,
                platform=args.platform,
                recover=recover,
            )
        with _recording(args.record_requests):
            result = run.run()
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: everything started was stopped")
        return EXIT_INTERRUPTED
    console.print(summary_table(result))
    if result.goodput is not None:
        console.print(goodput_table(result.goodput))
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    return 0 if result.passed else 1


@contextlib.contextmanager
def _recording(directory: Path | None) -> Iterator[None]:
    """Record the run's AWS requests into `directory`, the training processes' too (their environment says where)."""
    if directory is None:
        yield
        return
    os.environ[request_log.RECORD_DIR_ENV] = str(directory)
    with request_log.recorded_to(directory):
        yield


if __name__ == "__main__":
    sys.exit(main())
