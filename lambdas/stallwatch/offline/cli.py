"""The ``stallwatch`` operator command.

    stallwatch replay corpus/traces/*.jsonl            # a timeline of alerts, warnings and stops per trace
    stallwatch replay my-job.jsonl --json --policy config.json
    stallwatch replay my-job.jsonl --plot my-job.png    # the signals, alarms and decisions on one time axis
    stallwatch export-trace my-job --region us-east-1 --out my-job.jsonl
    stallwatch export-trace llm-70b --platform ec2 --stack stallwatch   # EC2 instances tagged stallwatch:job=llm-70b
    stallwatch export-trace i-0123456789abcdef0 --out my-host.jsonl   # an untagged instance is named by its id
    stallwatch incidents | status | snooze | policy show   # operator commands (`ops.py`)
    stallwatch report my-job                            # the goodput of my-job's run (`report.py`)
    stallwatch doctor [--send-test-alert]                # is the deployment working? (`doctor.py`)

Each subcommand is a function that adds its parser to `COMMANDS`' subparsers and sets ``handler``;
a new subcommand is one more entry in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stallwatch import __version__
from stallwatch.aws.observability import cap_library_loggers
from stallwatch.core.alarms import parse_alarm_name
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.decision import Action
from stallwatch.core.platforms import describe
from stallwatch.core.policy import MODE_TAG, Mode, Policy
from stallwatch.core.signals import Platform
from stallwatch.core.trace import TraceError, TraceHeader, scan_trace
from stallwatch.offline import doctor, ops, plots, report
from stallwatch.offline.formats import hms
from stallwatch.offline.progress import WorkProgress
from stallwatch.offline.replay import ReplayResult, Verdict, replay_events

EXIT_OK = 0
EXIT_FAILED = 1  # a labeled trace failed its label
EXIT_USAGE = 2  # bad input: unreadable trace or policy, unknown job

ACTION_STYLES = {Action.STOP: "bold red", Action.WARN: "yellow", Action.ALERT: "cyan", Action.AUDIT: "dim"}
VERDICT_STYLES = {Verdict.PASS: "green", Verdict.FAIL: "bold red"}


_clock = hms  # trace seconds as h:mm:ss


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (``stallwatch report: argument JOB: ...``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: object) -> str:
    """An error's text on one line (botocore's and pydantic's messages have several)."""
    return " ".join(str(message).split())


def _read_policy(path: Path) -> tuple[Policy, StallwatchConfig]:
    """A Policy JSON file, or a whole StallwatchConfig (``{"policy": ..., "sweeper_minutes": ...}``)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(raw, dict) and "policy" in raw:
        config = StallwatchConfig.model_validate(raw)
        return config.policy, config
    return Policy.model_validate(raw), StallwatchConfig()


def _trigger(trigger: str, prefix: str) -> str:
    """An alarm name as its kind (and host); the sweeper as itself."""
    try:
        ref = parse_alarm_name(trigger, prefix)
    except ValueError:
        return trigger
    return f"{ref.kind} {ref.host}" if ref.host else ref.kind


def _print_timeline(console: Console, result: ReplayResult, prefix: str) -> None:
    """The replay as a table. Everything from the trace (its path, job name, reasons quoting log lines) is plain
    `Text`, never console markup: a ``[rank 3]`` in a log line or a path must print as written."""
    verdict = "unlabeled" if result.verdict is None else str(result.verdict).upper()
    console.print(Text.assemble((result.trace, "bold"), f"  job {result.job}  mode {result.mode}"))
    table = Table(show_header=True, header_style="bold", expand=False)
    for column in ("t", "action", "would", "diagnosis", "trigger", "reasons"):
        table.add_column(column, overflow="fold")
    for d in result.decisions:
        decision = d.decision
        table.add_row(
            _clock(d.t),
            Text(str(decision.action), style=ACTION_STYLES.get(decision.action, "")),
            str(decision.would) if decision.would is not Action.NONE else "",
            str(decision.diagnosis),
            Text(_trigger(d.trigger, prefix)),
            Text("; ".join(decision.reasons)),
        )
    if result.decisions:
        console.print(table)
    else:
        console.print("  no alert, warning or stop")
    console.print(
        Text.assemble(
            f"  first alert {_clock(result.first_alert_s)}, warning {_clock(result.first_warn_s)}, "
            f"stop {_clock(result.first_stop_s)}; {result.alerts} alerts, {result.warnings} warnings  ->  ",
            (verdict, VERDICT_STYLES.get(result.verdict, "")),
            f" ({result.verdict_reason})",
        )
    )
    for error in result.tag_errors:
        console.print(Text.assemble(("  tag ignored: ", "yellow"), error))
    console.print()


def _plot_path(plot: Path, trace: Path, traces: int) -> Path:
    """Where a trace's chart goes: the file `plot` for one trace; for several, `<trace>.png` in the folder `plot`."""
    return plot if traces == 1 else plot / f"{trace.stem}.png"


def tagged(header: TraceHeader, mode: Mode | None) -> TraceHeader:
    """The trace's header with its job tagged ``stallwatch:mode=<mode>``: the job as it would be watched once
    tagged so (with the deployment's policy, `--mode enforce` replays the stops the tag would allow)."""
    if mode is None:
        return header
    job = header.job.model_copy(update={"tags": {**header.job.tags, MODE_TAG: mode.value}})
    return header.model_copy(update={"job": job})


def _replay_path(path: Path, policy: Policy | None, config: StallwatchConfig, mode: Mode | None) -> ReplayResult:
    with open(path, encoding="utf-8") as lines:
        header, events = scan_trace(lines, source=str(path))
        return replay_events(tagged(header, mode), events, str(path), policy, config)


def run_replay(args: argparse.Namespace) -> int:
    if args.plot:
        plots.require_matplotlib()  # before any replay
    policy, config = _read_policy(args.policy) if args.policy else (None, StallwatchConfig())
    console = Console()
    failed = False
    with WorkProgress(quiet=args.json) as progress:
        for path in progress.over(args.traces, "replaying", name=lambda p: p.name):
            result = _replay_path(path, policy, config, args.mode)
            failed |= result.verdict is Verdict.FAIL
            if args.json:
                print(json.dumps(result.to_json()))
            else:
                _print_timeline(console, result, config.alarm_prefix)
            if args.plot:
                chart = plots.replay_chart(result, path, config.alarm_prefix)
                print(f"wrote {chart.save(_plot_path(args.plot, path, len(args.traces)))}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


@ops.reported
def run_export(args: argparse.Namespace) -> int:
    # imported here: only this subcommand needs boto3 clients
    from stallwatch.offline.export import export_trace, platform_of

    out = args.out or Path(f"{args.job}.jsonl")
    deployment = ops.Deployment.from_args(args)
    platform = args.platform or platform_of(args.job)
    # An EC2 job's logs are in the deployment's log group (its config: --config, else the deployed functions').
    config = deployment.config if describe(platform).configured_logs else None
    # A Slurm job is what its events said, in the deployment's table.
    store = deployment.store() if describe(platform).known_from_events else None
    clients = deployment.clients
    with WorkProgress() as progress, progress.aws_calls(clients.session, f"exporting {args.job}"):
        trace = export_trace(args.job, clients, out, platform=platform, config=config, store=store)
    print(f"wrote {out}: {len(trace.events)} events over {_clock(trace.duration_s)}", file=sys.stderr)
    return EXIT_OK


def _add_replay(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("replay", help="replay traces through the alarms and the engine (backtest)")
    parser.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace files (format v1, JSON Lines)")
    parser.add_argument("--json", action="store_true", help="one JSON object per trace instead of a timeline")
    parser.add_argument(
        "--policy", type=Path, metavar="FILE", help="Policy or StallwatchConfig JSON (default: enforce everything)"
    )
    parser.add_argument(
        "--mode",
        type=Mode,
        choices=list(Mode),
        help="replay each job as if tagged stallwatch:mode=MODE (with the deployment's --policy, enforce shows the "
        "stops opting the job in would allow); default: the trace's own tags",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw each replay as a chart (needs the plot extra: matplotlib); with several traces, a folder",
    )
    parser.set_defaults(handler=run_replay)


def _add_export(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("export-trace", help="write a SageMaker or EC2 job's history as a trace")
    parser.add_argument(
        "job",
        metavar="JOB",
        type=ops.job_name,
        help="the SageMaker training job name; an EC2 job's stallwatch:job tag (with --platform ec2), or the id "
        "(i-...) of an untagged instance",
    )
    parser.add_argument(
        "--platform", type=Platform, choices=list(Platform), help="default: ec2 for an instance id, else sagemaker"
    )
    parser.add_argument("--out", type=Path, metavar="FILE", help="output file (default: JOB.jsonl)")
    ops.deployment_flags(parser)
    parser.set_defaults(handler=run_export)


# Subcommands, in help order: each adds its parser and sets `handler(args) -> exit code`.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_replay,
    _add_export,
    ops.register,
    report.register,
    doctor.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="stallwatch", description="Stallwatch: backtest and operate the stall watchdog.")
    parser.add_argument("--version", action="version", version=f"stallwatch {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stallwatch`` console script; returns the exit code."""
    cap_library_loggers()
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (TraceError, OSError, ValueError) as exc:
        print(f"stallwatch {args.command}: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
