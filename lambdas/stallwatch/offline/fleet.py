"""``stallwatch report --fleet``: goodput and badput by cause across every watched run since a time, by platform,
instance type and team, and the runs whose badput cost most; as tables, JSON, or a chart.

    stallwatch report --fleet --since 30d
    stallwatch report --fleet --since 7d --json --top 20
    stallwatch report --fleet --since 30d --plot fleet.png
    stallwatch report --fleet --since 30d --ended-only       # the recorded runs only: one Query, no platform read

The runs that ended come from the deployment's table, each as it was measured when it ended (`aws.fleet_runs`); the
runs still going are measured as they stand, from each platform's running jobs (`aws.goodput.run_spans`). A run's
team is its `stallwatch:team` tag, else its `team` tag (`core.fleet.TEAM_TAGS`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stallwatch.core.fleet import GROUPINGS, FleetGoodput, Group, RunRecord, fleet_goodput
from stallwatch.core.goodput import Category, measure_goodput
from stallwatch.core.platforms import describe
from stallwatch.offline import ops, plots
from stallwatch.offline.formats import LABELS, hms, money
from stallwatch.offline.progress import WorkProgress

GROUP_TITLES = {"platform": "platform", "instance_type": "instance type", "team": "team"}


def fleet_runs(deployment: ops.Deployment, since: float, now: float, period: int, running: bool) -> list[RunRecord]:
    """The runs that ended at or after `since` (recorded), and (`running`) those going now, measured as they stand;
    a running run that cannot be measured is named on stderr and left out."""
    # imported here: the replay commands need no AWS SDK
    from stallwatch.aws.fleet_runs import FleetRuns
    from stallwatch.aws.goodput import run_spans
    from stallwatch.aws.platforms import adapters
    from stallwatch.aws.source import JobNotFoundError

    store = deployment.store()
    runs = FleetRuns(store).since(since)
    if not running:
        return runs
    seen = {(r.platform, r.run) for r in runs}
    for source in adapters(deployment.clients, store=store):
        platform = source.platform
        for name, facts in source.running_jobs(now).items():
            try:
                tags = (facts or source.facts(name)).tags
                run, spans = run_spans(deployment.clients, store, name, now, period, platform)
            except JobNotFoundError as exc:
                print(f"left out {describe(platform).label} job {name}: {ops.one_line(exc)}", file=sys.stderr)
                continue
            if (platform.value, run) in seen:
                continue
            seen.add((platform.value, run))
            runs.append(RunRecord.of(measure_goodput(run, spans), spans, platform.value, tags, running=True))
    return runs


def cause_table(fleet: FleetGoodput, title: str) -> Table:
    """The fleet's GPU-hours, share and dollars by category."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in ("category", "wall time", "GPU-hours", "share", "cost"):
        table.add_column(column, justify="left" if column == "category" else "right")
    gpu_hours = fleet.total.gpu_hours
    for category, total in fleet.totals.items():
        if total.seconds <= 0:
            continue
        share = total.gpu_hours / gpu_hours if gpu_hours else 0.0
        style = "green" if category is Category.PRODUCTIVE else ""
        row = (LABELS[category], hms(total.seconds), f"{total.gpu_hours:,.2f}", f"{share:.1%}", money(total.dollars))
        table.add_row(*row, style=style)
    table.add_section()
    table.add_row("total", "", f"{gpu_hours:,.2f}", "100.0%", money(fleet.total.dollars))
    table.caption = f"goodput {fleet.ratio:.1%} of the GPU-hours paid for, over {len(fleet.runs)} runs"
    table.caption_justify = "left"
    return table


def group_table(fleet: FleetGoodput, grouping: str) -> Table:
    """One row per platform (instance type, team): its runs, GPU-hours, goodput, badput and where most of it went."""
    table = Table(title=f"By {GROUP_TITLES[grouping]}", title_justify="left", header_style="bold")
    for column in (GROUP_TITLES[grouping], "runs", "GPU-hours", "goodput", "badput GPU-h", "badput cost", "most of it"):
        table.add_column(column, justify="left" if column in (GROUP_TITLES[grouping], "most of it") else "right")
    for key, group in sorted(fleet.groups[grouping].items(), key=lambda kv: -kv[1].gpu_hours):
        badput = group.badput
        table.add_row(
            Text(key),  # plain text: a team tag as written
            str(group.runs),
            f"{group.gpu_hours:,.2f}",
            f"{group.ratio:.1%}",
            f"{badput.gpu_hours:,.2f}",
            money(badput.dollars),
            _top_cause(group),
        )
    return table


def costliest_table(fleet: FleetGoodput, top: int) -> Table:
    """The runs whose badput cost most."""
    table = Table(title=f"The {top} runs whose badput cost most", title_justify="left", header_style="bold")
    for column in ("run", "platform", "team", "instance type", "GPU-hours", "goodput", "badput cost", "most of it"):
        table.add_column(column, justify="right" if column in ("GPU-hours", "goodput", "badput cost") else "left")
    for run in fleet.costliest(top):
        cause = run.top_cause
        badput = run.badput
        cost = money(badput.dollars) if badput.dollars is not None else f"{badput.gpu_hours:,.2f} GPU-h"
        table.add_row(
            Text(run.run + (" (running)" if run.running else "")),
            run.platform,
            Text(run.team),
            run.instance_type,
            f"{run.gpu_hours:,.2f}",
            f"{run.ratio:.1%}",
            cost,
            LABELS[cause] if cause is not None else "",
        )
    return table


def _top_cause(group: Group) -> str:
    causes = {c: t.gpu_hours for c, t in group.totals.items() if c is not Category.PRODUCTIVE and t.gpu_hours > 0}
    return LABELS[max(causes, key=lambda c: causes[c])] if causes else ""


@ops.reported
def run_fleet_report(args: argparse.Namespace) -> int:
    if args.plot:
        plots.require_matplotlib()  # before any AWS call
    deployment = ops.Deployment.from_args(args)
    now = time.time()
    since = now - args.since
    with (
        WorkProgress(quiet=args.json) as progress,
        progress.aws_calls(deployment.clients.session, "reading the fleet's runs"),
    ):
        runs = fleet_runs(deployment, since, now, args.period, running=not args.ended_only)
    fleet = fleet_goodput(runs)
    if args.json:
        print(json.dumps({"since": since, **fleet.as_json(args.top)}, indent=2))
    else:
        console = Console()
        day = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%d %H:%M UTC")
        running = sum(1 for r in fleet.runs if r.running)
        title = f"Fleet goodput since {day} ({len(fleet.runs) - running} runs ended, {running} running)"
        console.print(cause_table(fleet, title))
        for grouping in GROUPINGS:
            console.print(group_table(fleet, grouping))
        console.print(costliest_table(fleet, args.top))
    if args.plot:
        print(f"wrote {plots.FleetChart(fleet, since, args.top).save(args.plot)}", file=sys.stderr)
    return 0
