"""The CLI's charts (``--plot FILE.png``), drawn by matplotlib on its Agg backend: an optional extra of the CLI
(``pip install './lambdas[plot]'``), never part of the Lambda asset.

    goodput_chart(goodput, spans).save("run.png")              # the run's wall time by category, per attempt, in $
    FleetChart(fleet, since).save("fleet.png")                 # the fleet's GPU-hours by category, by group, top runs
    replay_chart(result, "my-job.jsonl", prefix).save("bt.png")   # signals, alarms and decisions on one time axis

Each chart is its data first (`GoodputChart`, `ReplayChart`: what the report or the replay says, in seconds since
the run's or the trace's start), then a figure drawn from exactly that data (`figure()`), so both can be checked.

Kept whole (over 500 lines): the charts share their data classes, axes and matplotlib set-up, imported
lazily once for the CLI.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallwatch.core.alarms import PROGRESS, parse_alarm_name
from stallwatch.core.decision import Action
from stallwatch.core.evaluator import AlarmState
from stallwatch.core.fleet import FleetGoodput
from stallwatch.core.goodput import Category, Goodput, JobSpan, Segment, Total, run_timeline
from stallwatch.core.measures import agent_power, gpu_util
from stallwatch.core.reading import METRIC_PERIOD_SECONDS
from stallwatch.core.signals import Series
from stallwatch.core.trace import scan_trace
from stallwatch.offline.formats import LABELS, hms, money
from stallwatch.offline.replay import ReplayResult
from stallwatch.offline.trace_source import TraceSource

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "charts need matplotlib: pip install './lambdas[plot]' (make setup installs it)"
DPI = 110
CATEGORY_COLORS = {
    Category.PRODUCTIVE: "#2e7d32",
    Category.REDONE: "#9ccc65",
    Category.STARTUP: "#78909c",
    Category.PHASES: "#1e88e5",
    Category.STALLS: "#e53935",
    Category.RESTART_GAPS: "#fb8c00",
    Category.PENDING: "#b0bec5",
    Category.SUSPENDED: "#8d6e63",
    Category.PREEMPTED: "#ab47bc",
    Category.REQUEUED: "#ffb74d",
    Category.TIME_LIMIT: "#6d4c41",
    Category.OTHER: "#bdbdbd",
}
FLEET_PANELS = {"platform": "by platform", "instance_type": "by instance type", "team": "by team"}  # `core.fleet`
ACTION_COLORS = {Action.ALERT: "#00838f", Action.WARN: "#f9a825", Action.STOP: "#c62828", Action.AUDIT: "#757575"}
MAX_HOSTS_IN_LEGEND = 8  # and above it, thinner lines
MAX_ALARM_ROWS = 16  # above it, one row per alarm kind
TICK_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400)  # seconds between time ticks
MAX_TICKS = 14
TITLE_SIZE = 10
UNHELD_STYLE = {"hatch": "//", "alpha": 0.45}
UNHELD_LABEL = "between attempts: no instance held"
AFTER_STOP_COLOR = "0.93"
EXPECTED_COLOR = "#c8e6c9"
ALARM_COLOR = "#ef6c00"
POWER_FROM_AGENT = "trainer agent (NVML, or on Trainium the Neuron driver)"
POWER_FROM_CLOUDWATCH_AGENT = "CloudWatch agent (power_draw)"
# The progress alarm of a job without the trainer agent: its metric never arrives and missing data counts as
# breaching, so it sits in ALARM for the whole run, by design; the host alarms and the rechecks watch such a job.
NO_DATA_STYLE = {"facecolor": "none", "edgecolor": "0.55", "hatch": "///", "linewidth": 0.5}
NO_DATA_LABEL = "in ALARM for want of data: no trainer agent (missing data counts as breaching)"
NO_DATA_NOTE = "no trainer agent: no Steps, so in ALARM all along; the host alarms and rechecks watch this job"


class PlotUnavailableError(ValueError):
    """matplotlib is not installed (the CLI's ``plot`` extra)."""


def require_matplotlib() -> None:
    """Fail before any work when a chart cannot be drawn."""
    try:
        import matplotlib  # noqa: F401 - imported here to check for the optional extra
    except ImportError as exc:
        raise PlotUnavailableError(INSTALL_HINT) from exc


def _figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas, outside pyplot's global state."""
    require_matplotlib()
    # imported here: matplotlib is the optional `plot` extra
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _clock_axis(ax: Axes, label: str, span: float) -> None:
    """Seconds on the x axis over [0, span], ticked at whole minutes or hours as h:mm."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    span = max(span, TICK_STEPS[0])
    step = next((s for s in TICK_STEPS if span / s <= MAX_TICKS), TICK_STEPS[-1])
    ax.xaxis.set_major_locator(MultipleLocator(step))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda s, _: hms(s)[:-3] if s >= 0 else ""))
    ax.set_xlim(0, span)
    ax.set_xlabel(label)


def _save(figure: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return out


# ---- goodput ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One stretch of the timeline: attempt `row`, from `left` for `width` seconds (since the run's start); `held`
    False between two attempts, while no instance is paid for."""

    row: int
    left: float
    width: float
    category: Category
    held: bool = True


@dataclass(frozen=True)
class GoodputChart:
    """The run's split as the report gives it (`goodput.totals`), and in time: one row per attempt."""

    goodput: Goodput
    rows: tuple[str, ...]  # the attempts' job names, first first
    bars: tuple[Bar, ...]

    def category_shares(self) -> dict[Category, float]:
        """Each category's share of the run's wall time, in percent (those with time only), as the split draws them."""
        wall = self.goodput.wall_s
        return {c: 100 * t.seconds / wall for c, t in self.goodput.totals.items() if t.seconds > 0 and wall > 0}

    def category_seconds(self) -> dict[Category, float]:
        """The timeline's seconds per category: the report's totals (its categories: a scheduler's holds only where
        the run has some)."""
        found = dict.fromkeys(self.goodput.totals, 0.0)
        for bar in self.bars:
            found[bar.category] += bar.width
        return found

    def figure(self) -> Figure:
        g = self.goodput
        figure = _figure(12, 3.0 + 0.5 * len(self.rows))
        timeline, split = figure.subplots(2, 1, height_ratios=[len(self.rows) + 0.5, 1])
        timeline.set_label("timeline")
        for bar in self.bars:
            style = {"color": CATEGORY_COLORS[bar.category]} | ({} if bar.held else UNHELD_STYLE)
            timeline.barh(bar.row, bar.width, left=bar.left, height=0.6, gid=bar.category.value, **style)
        timeline.set_yticks(range(len(self.rows)), labels=list(self.rows))
        timeline.set_ylim(len(self.rows) - 0.5, -0.5)  # the first attempt on top
        timeline.set_title("Each attempt in time", loc="left", fontsize=TITLE_SIZE)
        split.set_label("split")
        left = 0.0
        for category, share in self.category_shares().items():
            total = g.totals[category]
            label = f"{LABELS[category]}: {hms(total.seconds)} ({share:.1f}%), {money(total.dollars)}"
            color = CATEGORY_COLORS[category]
            split.barh(0, share, left=left, height=0.6, color=color, label=label, gid=category.value)
            left += share
        split.set_yticks([0], labels=["whole run"])
        split.set_xlim(0, 100)
        split.set_xlabel("share of the run's wall time (%)")
        title = "The run's wall time by category: its share, and its dollars while the instances are held"
        split.set_title(title, loc="left", fontsize=TITLE_SIZE)
        handles = split.get_legend_handles_labels()[0]
        if not all(bar.held for bar in self.bars):
            from matplotlib.patches import Patch

            handles.append(Patch(facecolor=CATEGORY_COLORS[Category.RESTART_GAPS], label=UNHELD_LABEL, **UNHELD_STYLE))
        figure.legend(handles=handles, loc="outside lower left", ncol=2, frameon=False, fontsize=9)
        _clock_axis(timeline, "since the run's start (h:mm)", g.wall_s)
        figure.suptitle(
            f"Goodput of run {g.run}: {g.ratio:.1%} of {hms(g.wall_s)}, {g.gpu_hours:,.1f} GPU-h, {money(g.dollars)}",
            x=0.01,
            ha="left",
            fontweight="bold",
        )
        return figure

    def save(self, path: str | Path) -> Path:
        return _save(self.figure(), path)


def goodput_chart(goodput: Goodput, jobs: Sequence[JobSpan]) -> GoodputChart:
    """The chart of `goodput`, measured from `jobs` (the run's `JobSpan`s, as `measure_goodput` was given them)."""
    ordered = sorted(jobs, key=lambda j: j.created)
    origin = ordered[0].created
    return GoodputChart(goodput, tuple(j.name for j in ordered), tuple(_bars(run_timeline(ordered), origin)))


def _bars(segments: Iterable[Segment], origin: float) -> list[Bar]:
    """Segments as bars from `origin`, those of one attempt and category that touch drawn as one."""
    bars: list[Bar] = []
    for s in segments:
        last = bars[-1] if bars else None
        touching = last is not None and math.isclose(last.left + last.width, s.start - origin, abs_tol=1e-6)
        if last is not None and touching and (last.row, last.category, last.held) == (s.attempt, s.category, s.held):
            bars[-1] = Bar(last.row, last.left, last.width + s.seconds, s.category, s.held)
        else:
            bars.append(Bar(s.attempt, s.start - origin, s.seconds, s.category, s.held))
    return bars


# ---- the fleet ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetChart:
    """The fleet's GPU-hours by category: the whole fleet, by platform, instance type and team, and the runs whose
    badput cost most, one stacked bar a row, as `stallwatch report --fleet` totals them."""

    fleet: FleetGoodput
    since: float  # the report's start (epoch seconds)
    top: int = 10

    def panels(self) -> dict[str, list[tuple[str, dict[Category, float]]]]:
        """Each panel's rows: (label, GPU-hours by category), the biggest first."""

        def hours(totals: dict[Category, Total]) -> dict[Category, float]:
            return {c: t.gpu_hours for c, t in totals.items() if t.gpu_hours > 0}

        panels = {"the fleet": [(f"{len(self.fleet.runs)} runs", hours(self.fleet.totals))]}
        for grouping, title in FLEET_PANELS.items():
            groups = sorted(self.fleet.groups[grouping].items(), key=lambda kv: -kv[1].gpu_hours)
            panels[title] = [(f"{key} ({g.ratio:.0%})", hours(g.totals)) for key, g in groups]
        costly = self.fleet.costliest(self.top)
        panels[f"the {len(costly)} costliest runs (badput)"] = [(run.run, hours(run.totals)) for run in costly]
        return panels

    def figure(self) -> Figure:
        panels = self.panels()
        heights = [max(len(rows), 1) + 0.8 for rows in panels.values()]
        figure = _figure(12, 1.5 + 0.35 * sum(heights))
        axes = figure.subplots(len(panels), 1, height_ratios=heights)
        drawn: set[Category] = set()
        for ax, (title, rows) in zip(axes, panels.items(), strict=True):
            ax.set_label(title)
            for index, (_, hours) in enumerate(rows):
                left = 0.0
                for category, value in hours.items():
                    label = None if category in drawn else LABELS[category]
                    drawn.add(category)
                    ax.barh(index, value, left=left, height=0.6, color=CATEGORY_COLORS[category], label=label)
                    left += value
            ax.set_yticks(range(len(rows)), labels=[label for label, _ in rows])
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.set_title(f"GPU-hours by category: {title}", loc="left", fontsize=TITLE_SIZE)
        axes[-1].set_xlabel("GPU-hours")
        handles = [h for ax in axes for h in ax.get_legend_handles_labels()[0]]
        figure.legend(handles=handles, loc="outside lower left", ncol=3, frameon=False, fontsize=9)
        f = self.fleet
        since = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d")
        figure.suptitle(
            f"Fleet goodput since {since}: {f.ratio:.1%} of {f.total.gpu_hours:,.1f} GPU-h, {money(f.total.dollars)}",
            x=0.01,
            ha="left",
            fontweight="bold",
        )
        return figure

    def save(self, path: str | Path) -> Path:
        return _save(self.figure(), path)


# ---- replay -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayChart:
    """A replay on the trace's time axis (seconds since InProgress): each host's GPU utilization (per device, as
    the engine reads it) and power, the steps, each host's log silence, the alarms while in ALARM; the decisions are
    the replay's (`result.decisions`)."""

    result: ReplayResult
    end: float  # the trace's end
    gpu_util: dict[str, Series]
    gpu_power: dict[str, Series]
    steps: Series  # steps completed per period (the agent's)
    log_silence: dict[str, Series]  # seconds since the host's last log line, each minute
    alarms: dict[str, tuple[tuple[float, float], ...]]  # alarm (kind, host) -> [start, end) spans in ALARM
    power_source: str = POWER_FROM_AGENT  # whose GPU power is drawn: the trainer agent's, or the CloudWatch agent's
    power_unit: str = "W"  # or "%" of the device's maximum (a NeuronCore's, from the Neuron driver)
    without_data: frozenset[str] = frozenset()  # alarm rows whose metric the trace never holds (in ALARM by design)

    def figure(self) -> Figure:
        r = self.result
        rows = max(len(self.alarms), 1)
        figure = _figure(12, 10 + 0.25 * rows)
        heights = [3, 2.5, 2, 2, 0.8 + 0.3 * rows]
        panels = figure.subplots(5, 1, sharex=True, height_ratios=heights)
        util, power, steps, silence, alarms = panels
        self._hosts(util, "gpu_util", self.gpu_util, 1.0, "GPU utilization\n(%, per GPU)")
        util.set_ylim(0, 105)  # a share: from zero, so jitter at the top does not read as swings
        self._hosts(
            power,
            "gpu_power",
            self.gpu_power,
            1.0,
            f"Power ({self.power_unit}, per device)\n{self.power_source}",
            "no GPU power in this trace (neither the trainer agent's nor the CloudWatch agent's)",
        )
        power.set_ylim(bottom=0)
        steps.set_label("steps")
        if self.steps.points:
            times, values = zip(*self.steps.points, strict=True)
            steps.plot(times, values, drawstyle="steps-post", color="#37474f", gid="steps")
        else:
            _empty(steps, "no steps (the agent's) in this trace")
        steps.set_ylabel("steps per minute")
        steps.set_ylim(bottom=0)
        self._hosts(silence, "log_silence", self.log_silence, 60.0, "log silence (min)", "no log lines in this trace")
        silence.set_ylim(bottom=0)
        self._alarms(alarms)
        for ax in panels:
            self._marks(ax)
        window = self._expected_window()
        if window is not None:
            alarms.axvspan(*window, color=EXPECTED_COLOR, zorder=0, gid="expected-stop")
        for mark in self.result.decisions:  # what each line is, once, above the top panel
            label = f"{mark.decision.action.value} ({mark.decision.diagnosis.value})"
            util.annotate(
                label, (mark.t, 1.01), xycoords=("data", "axes fraction"), rotation=90, fontsize=8, va="bottom"
            )
        handles = [_line(color, action.value) for action, color in ACTION_COLORS.items() if self._has(action)]
        handles += self._region_handles(window)
        if handles:
            figure.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize=8)
        _clock_axis(alarms, "since the job entered InProgress (h:mm)", self.end)
        figure.suptitle(
            f"Replay of {Path(r.trace).name}: job {r.job}, mode {r.mode}, {self.verdict_text()}", x=0.01, ha="left"
        )
        return figure

    def verdict_text(self) -> str:
        """The verdict, its times in the axis's h:mm:ss: "PASS: a stop expected 1:05:00-1:35:00, stopped at 1:26:40"."""
        r = self.result
        if r.verdict is None:
            return "unlabeled"
        expect = r.expect or {}
        window = self._expected_window()
        if expect.get("action") == "stop":
            said = "a stop expected" + (f" {hms(window[0])}-{hms(window[1])}" if window else "")
        else:
            said = "no stop expected"
        said += f", stopped at {hms(r.first_stop_s)}" if r.first_stop_s is not None else ", not stopped"
        others = [
            part
            for part in r.verdict_reason.split("; ")
            if not part.startswith(("expected a stop", "expected no stop"))
        ]
        if r.verdict.value == "fail" and others:
            said += "; " + "; ".join(others)
        return f"{r.verdict.value.upper()}: {said}"

    def _expected_window(self) -> tuple[float, float] | None:
        window = (self.result.expect or {}).get("window_s")
        return None if window is None else (float(window[0]), float(min(window[1], self.end)))

    def _region_handles(self, window: tuple[float, float] | None) -> list[Any]:
        """What each shaded region is, for the legend."""
        from matplotlib.patches import Patch

        handles = []
        stop = self.result.first_stop_s
        if stop is not None and stop < self.end:
            handles.append(Patch(color=AFTER_STOP_COLOR, label=f"after the stop ({hms(stop)}): the time it saved"))
        if window is not None:
            label = f"expected stop window {hms(window[0])}-{hms(window[1])}"
            handles.append(Patch(color=EXPECTED_COLOR, label=label))
        if self.without_data:
            handles.append(Patch(label=NO_DATA_LABEL, **NO_DATA_STYLE))
        return handles

    def save(self, path: str | Path) -> Path:
        return _save(self.figure(), path)

    def _has(self, action: Action) -> bool:
        return any(m.decision.action is action for m in self.result.decisions)

    def _hosts(
        self, ax: Axes, label: str, series: dict[str, Series], unit: float, ylabel: str, missing: str = "no data"
    ) -> None:
        """One line per host (values divided by `unit`); a legend while there are few hosts."""
        ax.set_label(label)
        ax.set_ylabel(ylabel)
        drawn = {host: s for host, s in series.items() if s.points}
        if not drawn:
            _empty(ax, missing)
            return
        for host, s in drawn.items():
            times, values = zip(*s.points, strict=True)
            width = 1.1 if len(drawn) <= MAX_HOSTS_IN_LEGEND else 0.5
            ax.plot(times, [v / unit for v in values], linewidth=width, label=host, gid=host)
        if len(drawn) <= MAX_HOSTS_IN_LEGEND:
            ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False, fontsize=8)

    def _alarms(self, ax: Axes) -> None:
        ax.set_label("alarms")
        names = list(self.alarms)
        for row, name in enumerate(names):
            style = NO_DATA_STYLE if name in self.without_data else {"color": ALARM_COLOR}
            for start, end in self.alarms[name]:
                ax.barh(row, end - start, left=start, height=0.6, gid=name, **style)
            if name in self.without_data:
                ax.text(
                    0.01, row, NO_DATA_NOTE, transform=ax.get_yaxis_transform(), va="center", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )  # fmt: skip
        labels = [f"{name} (no data)" if name in self.without_data else name for name in names]
        ax.set_yticks(range(len(names)), labels=labels, fontsize=8)
        ax.set_ylim(max(len(names), 1) - 0.5, -0.5)
        ax.set_ylabel("in ALARM")
        if not names:
            _empty(ax, "no alarm went to ALARM")

    def _marks(self, ax: Axes) -> None:
        """The decisions as vertical lines; after the first stop, the trace the stop cut off is shaded."""
        stop = self.result.first_stop_s
        if stop is not None and stop < self.end:
            ax.axvspan(stop, self.end, color=AFTER_STOP_COLOR, zorder=0, gid="after-stop")
        for mark in self.result.decisions:
            action = mark.decision.action
            ax.axvline(
                mark.t, color=ACTION_COLORS[action], linewidth=1.4, linestyle="--", gid=f"decision:{action.value}"
            )


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.45")
    ax.set_yticks([])


def _line(color: str, label: str) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, linestyle="--", linewidth=1.4, label=label)


def replay_chart(result: ReplayResult, trace: str | Path, alarm_prefix: str) -> ReplayChart:
    """The chart of `result`, the replay of the trace file `trace` (read again, whole, for its series)."""
    with open(trace, encoding="utf-8") as lines:
        header, events = scan_trace(lines, source=str(trace))
        source = TraceSource.streamed(header, events, str(trace), lookback=math.inf)
    since = lambda s: Series(tuple((t - source.base, v) for t, v in s.points))  # noqa: E731 - epoch to trace t
    signals = source.job_signals(source.job_name, source.epoch(source.last_t) + METRIC_PERIOD_SECONDS)
    hosts = signals.hosts
    powers = {h: agent_power(s) for h, s in hosts.items()}  # the agent's: watts, or a NeuronCore's % of its maximum
    by_agent = [unit for series, unit in powers.values() if series.points]
    alarms = _alarm_spans(result, alarm_prefix, source.last_t)
    return ReplayChart(
        result=result,
        end=source.last_t,
        gpu_util={h: since(gpu_util(s)) for h, s in hosts.items()},
        gpu_power={h: since(powers[h][0] if by_agent else s.gpu_power) for h, s in hosts.items()},
        steps=since(signals.agent.get("Steps", Series())),
        log_silence={h: _silence(source, h) for h in source.hosts},
        alarms=alarms,
        power_source=POWER_FROM_AGENT if by_agent else POWER_FROM_CLOUDWATCH_AGENT,
        power_unit=by_agent[0] if by_agent else "W",
        without_data=frozenset() if signals.has_agent else frozenset(a for a in alarms if a == PROGRESS),
    )


def _silence(source: TraceSource, host: str) -> Series:
    """Seconds since `host`'s last log line, each minute of the trace (none before its first line)."""
    points = []
    for minute in range(int(source.last_t // 60) + 1):
        t = minute * 60.0
        last = source.log_last_t(host, source.epoch(t))
        if last is not None:
            points.append((t, source.epoch(t) - last))
    return Series(tuple(points))


def _alarm_spans(result: ReplayResult, prefix: str, end: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """When each alarm was in ALARM, one row per alarm by its kind and host (``gpu-idle algo-3``), hosts in number
    order; past `MAX_ALARM_ROWS` rows, one per kind (``gpu-idle (any of 64 hosts)``) over the time any host's was.
    An alarm still in ALARM when the replay ended runs to `end` (the replay's stop, else the trace's end)."""
    until = result.first_stop_s if result.first_stop_s is not None else end
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    since: dict[tuple[str, str], float] = {}
    for change in result.alarm_changes:
        alarm = _alarm_of(change.alarm, prefix)
        if change.state is AlarmState.ALARM:
            since.setdefault(alarm, change.t)
        elif alarm in since:
            spans.setdefault(alarm, []).append((since.pop(alarm), change.t))
    for alarm, start in since.items():
        spans.setdefault(alarm, []).append((start, until))
    ordered = sorted(spans, key=lambda a: (a[0], _number_order(a[1])))
    if len(ordered) <= MAX_ALARM_ROWS:
        return {" ".join(filter(None, alarm)): tuple(sorted(spans[alarm])) for alarm in ordered}
    kinds: dict[str, list[tuple[float, float]]] = {}
    hosts: dict[str, set[str]] = {}
    for kind, host in ordered:
        kinds.setdefault(kind, []).extend(spans[(kind, host)])
        hosts.setdefault(kind, set()).add(host)
    return {
        kind if hosts[kind] == {""} else f"{kind} (any of {len(hosts[kind])} hosts)": _union(found)
        for kind, found in kinds.items()
    }


def _alarm_of(name: str, prefix: str) -> tuple[str, str]:
    """An alarm as (kind, host) (host "" for a job's alarm); a name not of this prefix as itself."""
    try:
        ref = parse_alarm_name(name, prefix)
    except ValueError:
        return name, ""
    return ref.kind, ref.host or ""


def _number_order(text: str) -> tuple[Any, ...]:
    """``algo-2`` before ``algo-10``: digits compared as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _union(spans: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Overlapping or touching spans as one."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)
