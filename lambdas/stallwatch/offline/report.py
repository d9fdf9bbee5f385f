"""``stallwatch report JOB``: the goodput of the run JOB belongs to, as a table or JSON, and as a chart.

    stallwatch report llama-8b-r1                     # the whole run: llama-8b, llama-8b-r1, ...
    stallwatch report llama-8b --json --period 60
    stallwatch report llama-8b --plot llama-8b.png    # and its chart: each attempt in time, the split in dollars
    stallwatch report llm-70b --platform ec2          # the instances tagged stallwatch:job=llm-70b (or i-0abc...)
    stallwatch report --fleet --since 30d [--plot fleet.png]   # every watched run (`fleet.py`)

Jobs and times come from SageMaker, or for an EC2 job from its instances and Stallwatch's resumes
(`aws.platforms.ec2_goodput`); without ``--platform`` a SageMaker job of that name is looked for first (an instance
id: EC2 first). The agent's windows come from CloudWatch (read at ``--period`` seconds, so a category is exact to one
period), Stallwatch's stops from the deployment's table (see `ops.Deployment`). On a terminal the AWS calls are
counted as they are made (`progress.WorkProgress`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stallwatch.core.goodput import Category, Goodput
from stallwatch.core.reading import METRIC_PERIOD_SECONDS
from stallwatch.core.signals import Platform
from stallwatch.offline import fleet, ops, plots
from stallwatch.offline.formats import LABELS, hms, money
from stallwatch.offline.progress import WorkProgress

PERIODS = (1, 5, 10, 20, 30, 60, 300)  # periods CloudWatch takes: high-resolution (under 60) and standard
FLEET_SINCE = "30d"
FLEET_TOP = 10


def goodput_table(goodput: Goodput) -> Table:
    """The run's split of time, GPU-hours and dollars, one row per category, and its figures in the caption."""
    jobs = ", ".join(goodput.jobs)
    table = Table(title=f"Goodput of run {goodput.run} ({jobs})", title_justify="left", header_style="bold")
    for column in ("category", "wall time", "share", "GPU-hours", "cost"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for category, total in goodput.totals.items():
        share = total.seconds / goodput.wall_s if goodput.wall_s else 0.0
        style = "green" if category is Category.PRODUCTIVE else ""
        table.add_row(
            LABELS[category],
            hms(total.seconds),
            f"{share:.1%}",
            f"{total.gpu_hours:,.2f}",
            money(total.dollars),
            style=style,
        )
    table.add_section()
    table.add_row("total", hms(goodput.wall_s), "100.0%", f"{goodput.gpu_hours:,.2f}", money(goodput.dollars))
    tflops = "n/a" if goodput.mean_tflops_per_gpu is None else f"{goodput.mean_tflops_per_gpu:.4g}"
    mfu = "n/a" if goodput.mean_mfu is None else f"{goodput.mean_mfu:.1f}%"
    step = "n/a" if goodput.final_step is None else f"{goodput.final_step:,.0f}"
    table.caption = (
        f"goodput {goodput.ratio:.1%} · mean {tflops} TFLOPs/GPU · MFU {mfu} · stalls caught {goodput.stalls_caught}"
        f" · restarts {goodput.restarts} · step {step} ({goodput.redone_steps:,.0f} redone)"
    )
    table.caption_justify = "left"
    return table


@ops.reported
def run_report(args: argparse.Namespace) -> int:
    # imported here: the replay commands need no AWS SDK
    from stallwatch.aws.goodput import run_spans
    from stallwatch.core.goodput import measure_goodput

    if (args.job is None) == (not args.fleet):
        raise ValueError("name a JOB, or ask for --fleet (not both)")
    if args.fleet:
        return fleet.run_fleet_report(args)
    if args.plot:
        plots.require_matplotlib()  # before any AWS call
    deployment = ops.Deployment.from_args(args)
    platform = Platform(args.platform) if args.platform else None
    with (
        WorkProgress(quiet=args.json) as progress,
        progress.aws_calls(deployment.clients.session, f"reading the run of {args.job}"),
    ):
        run, spans = run_spans(deployment.clients, deployment.store(), args.job, time.time(), args.period, platform)
    goodput = measure_goodput(run, spans)
    if args.json:
        print(json.dumps(goodput.as_json(), indent=2))
    else:
        console = Console()
        console.print(goodput_table(goodput))
        for job, why in goodput.stall_whys:  # plain text: the summary quotes the job's source lines
            console.print(Text.assemble(("why ", "bold"), f"{job} stalled: {why}"))
    if args.plot:
        print(f"wrote {plots.goodput_chart(goodput, spans).save(args.plot)}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``report`` to the ``stallwatch`` CLI."""
    parser = subparsers.add_parser(
        "report", help="the goodput of a run (a job and its resumes, or an EC2 job), or of the fleet (--fleet)"
    )
    parser.add_argument(
        "job",
        metavar="JOB",
        nargs="?",
        type=ops.job_name,
        help="a SageMaker training job of the run (the first or a resume), or an EC2 job",
    )
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="every watched run instead: goodput and badput by cause, platform, instance type and team, the runs "
        "that cost most",
    )
    parser.add_argument(
        "--since",
        type=ops.parse_duration,
        default=ops.parse_duration(FLEET_SINCE),
        metavar="DURATION",
        help=f"with --fleet: the runs that ended within it, and those running (default {FLEET_SINCE})",
    )
    parser.add_argument(
        "--top", type=int, default=FLEET_TOP, help=f"with --fleet: how many of the costliest runs (default {FLEET_TOP})"
    )
    parser.add_argument(
        "--ended-only", action="store_true", help="with --fleet: the recorded runs only (no running run is measured)"
    )
    parser.add_argument(
        "--platform",
        choices=[p.value for p in Platform],
        help="where JOB runs (default: SageMaker, else EC2: its stallwatch:job tag, or an instance id)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="also draw the run as a chart (needs the plot extra: matplotlib)"
    )
    parser.add_argument(
        "--period",
        type=int,
        choices=PERIODS,
        default=METRIC_PERIOD_SECONDS,
        help=f"seconds per metric period read (default {METRIC_PERIOD_SECONDS})",
    )
    ops.deployment_flags(parser)
    parser.set_defaults(handler=run_report)
