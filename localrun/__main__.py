"""``python -m localrun``: the whole product on this machine, on moto, in under three minutes.

    python -m localrun                      # the default: an NCCL-style hang, stopped
    python -m localrun --scenario checkpoint
    python -m localrun --scenario crash --json > result.json
    python -m localrun --scenario hang --resume   # stopped, resumed as <job>-r1 from its checkpoint, goodput report

Exit code 0 only if the scenario's expected outcome happened; 130 after Ctrl-C (everything is cleaned up).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from types import FrameType

from rich.console import Console

from localrun.run import LocalRun
from localrun.scenarios import DEFAULT_SCENARIO, RESUMABLE_SCENARIOS, RESUME_DEADLINE_S, RUN_DEADLINE_S, SCENARIOS
from localrun.summary import summary_table
from stallwatch.offline.report import goodput_table

EXIT_INTERRUPTED = 130
LOG_WIDTH = 120


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
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout (the view on stderr)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="the job opts in to a restart from its checkpoint: Stallwatch resumes it after the stop "
        "(hang and crash), and the run ends with its goodput report",
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
    deadline = args.deadline or (RESUME_DEADLINE_S if args.resume else RUN_DEADLINE_S)
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
        run = LocalRun(
            SCENARIOS[args.scenario], console, deadline_s=deadline, interrupted=interrupted, resume=args.resume
        )
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


if __name__ == "__main__":
    sys.exit(main())
