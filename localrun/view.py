"""The terminal view: timeline events as they happen, a live status panel on a TTY, Slack messages as panels.

On a terminal the status panel is redrawn in place (rich Live); elsewhere (CI, a pipe) the same
status is printed as a line every `STATUS_LINE_EVERY_S`, so the log reads top to bottom.
"""

from __future__ import annotations

import re
import threading
import time
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.emoji import Emoji
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from localrun.slack_receiver import SlackMessage
from localrun.timeline import Event, Kind, Snapshot, Timeline

STATUS_LINE_EVERY_S = 10.0
REFRESH_PER_SECOND = 4
KIND_STYLES: dict[Kind, str] = {
    Kind.SETUP: "dim",
    Kind.TRAIN: "cyan",
    Kind.FAULT: "bold magenta",
    Kind.STACKS: "magenta",
    Kind.ALARM: "yellow",
    Kind.DECISION: "bold blue",
    Kind.SLACK: "green",
    Kind.JOB: "bold",
    Kind.ERROR: "bold red",
}
ALARM_STYLES = {"OK": "green", "ALARM": "bold red", "INSUFFICIENT_DATA": "dim"}
_MRKDWN_BOLD = re.compile(r"\*([^*\n]+)\*")
_MRKDWN_LINK = re.compile(r"<([^|>]+)\|([^>]+)>")
# Slack emoji names that rich spells differently.
SLACK_EMOJI_ALIASES = {":octagonal_sign:": ":stop_sign:"}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def status_table(snapshot: Snapshot, alarm_prefix: str) -> Table:
    """Training progress, simulated utilization, job status and every alarm's state."""
    p = snapshot.progress
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    table.add_row("elapsed", f"{time.time() - snapshot.started_at:5.1f} s")
    table.add_row("step", _fmt(p.step, "d"))
    table.add_row("TFLOPs/GPU", _fmt(p.tflops_per_gpu, ".3g"))
    table.add_row("MFU", _fmt(p.mfu, ".1f", " %"))
    table.add_row("loss", _fmt(p.loss, ".3f"))
    table.add_row("last step age", _fmt(p.last_step_age, ".1f", " s"))
    if p.phase_budget_remaining:
        table.add_row("phase budget left", _fmt(p.phase_budget_remaining, ".0f", " s"))
    table.add_row("GPU util (per GPU)", _fmt(snapshot.gpu_util_per_device, ".0f", " %"))
    table.add_row("job", f"{snapshot.job_status} / {snapshot.secondary_status}")
    for name, state in sorted(snapshot.alarms.items()):
        table.add_row(f"alarm {name.removeprefix(alarm_prefix)}", Text(state, style=ALARM_STYLES.get(state, "")))
    return table


def status_line(snapshot: Snapshot, alarm_prefix: str) -> str:
    """The status panel as one line, for logs: alarms not OK by name, the rest counted."""
    p = snapshot.progress
    alarms_by_name = sorted(snapshot.alarms.items())
    not_ok = [f"{name.removeprefix(alarm_prefix)} {state}" for name, state in alarms_by_name if state != "OK"]
    ok = len(snapshot.alarms) - len(not_ok)
    alarms = ", ".join([*not_ok, f"{ok} OK"] if ok else not_ok)
    return (
        f"step {_fmt(p.step, 'd')} · {_fmt(p.tflops_per_gpu, '.3g')} TFLOPs/GPU · "
        f"GPU {_fmt(snapshot.gpu_util_per_device, '.0f', '%')} · job {snapshot.job_status}/{snapshot.secondary_status}"
        + (f" · alarms: {alarms}" if alarms else "")
    )


def _emoji(text: str) -> str:
    """Emoji codes as emoji, and Slack's three entities as what they stand for, as Slack shows them."""
    for slack, rich in SLACK_EMOJI_ALIASES.items():
        text = text.replace(slack, rich)
    return Emoji.replace(_shown(text))


def _shown(text: str) -> str:
    """`&lt;`, `&gt;` and `&amp;` read back (stallwatch.aws.slack_text escapes them)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _mrkdwn(text: str) -> list[Text]:
    """Slack mrkdwn to rich lines: emoji codes, bold and links; code blocks dim, one row per line."""
    text = _emoji(_MRKDWN_LINK.sub(r"\2 (\1)", text))
    lines: list[Text] = []
    for i, chunk in enumerate(text.split("```")):
        if i % 2:  # inside a code block: log lines, cut to the panel's width
            lines += [Text(line, style="dim", no_wrap=True, overflow="ellipsis") for line in chunk.splitlines()]
            continue
        for line in chunk.strip("\n").splitlines():
            out, last = Text(), 0
            for match in _MRKDWN_BOLD.finditer(line):
                out.append(line[last : match.start()])
                out.append(match.group(1), style="bold")
                last = match.end()
            out.append(line[last:])
            lines.append(out)
    return lines


def _field(text: str) -> list[Text]:
    """A section field ("*Label*\nvalue") on one line: "Label: value"."""
    label, _, value = text.partition("\n")
    return _mrkdwn(f"{label}: {value}" if value and "```" not in value else text)


def _block_text(block: dict[str, Any]) -> list[Text]:
    kind = block.get("type")
    if kind == "header":
        return [Text(_emoji(block.get("text", {}).get("text", "")), style="bold")]
    if kind == "section":
        lines = _mrkdwn(block["text"]["text"]) if block.get("text") else []
        return lines + [line for field in block.get("fields", []) for line in _field(field.get("text", ""))]
    if kind == "context":
        return [Text(_shown(" · ".join(e.get("text", "") for e in block.get("elements", []))), style="dim")]
    if kind == "rich_text":
        return [Text(_rich_text_plain(block))]
    if kind == "actions":
        labels = [e.get("text", {}).get("text", "?") for e in block.get("elements", [])]
        return [Text("  ".join(f"[ {label} ]" for label in labels), style="bold cyan")]
    if kind == "divider":
        return [Text("─" * 40, style="dim")]
    return []


def _rich_text_plain(block: dict[str, Any]) -> str:
    parts: list[str] = []
    for element in block.get("elements", []):
        for item in element.get("elements", []):
            parts.append(item.get("text", ""))
    return "".join(parts)


def slack_panel(message: SlackMessage) -> Panel:
    """A Slack message (Block Kit, or its text fallback) as a terminal panel."""
    blocks = message.payload.get("blocks") or []
    lines = [line for block in blocks for line in _block_text(block)] or _mrkdwn(message.text)
    return Panel(Group(*lines), title="Slack (local receiver)", title_align="left", border_style="green")


class RunView:
    """Prints the timeline and Slack messages as they arrive; keeps a status panel (TTY) or status lines."""

    def __init__(self, console: Console, timeline: Timeline, title: str, alarm_prefix: str) -> None:
        self.console = console
        self._timeline = timeline
        self._title = title
        self._alarm_prefix = alarm_prefix
        self._live: Live | None = None
        self._stop = threading.Event()
        self._status_thread: threading.Thread | None = None
        self._print_lock = threading.Lock()

    def __enter__(self) -> RunView:
        for event in self._timeline.snapshot().events:  # what happened before the view opened
            self.on_event(event)
        self._timeline.subscribe(self.on_event)
        if self.console.is_terminal:
            self._live = Live(
                get_renderable=self._panel,
                console=self.console,
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        else:
            self._status_thread = threading.Thread(target=self._print_status_lines, name="status-lines", daemon=True)
            self._status_thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._status_thread is not None:
            self._status_thread.join()
        if self._live is not None:
            self._live.stop()
        self.console.print(Panel(self._table(), title=self._title, title_align="left"))

    def _table(self) -> Table:
        return status_table(self._timeline.snapshot(), self._alarm_prefix)

    def _panel(self) -> Panel:
        return Panel(self._table(), title=self._title, title_align="left", border_style="blue")

    def _print_status_lines(self) -> None:
        while not self._stop.wait(STATUS_LINE_EVERY_S):
            snapshot = self._timeline.snapshot()
            self._print(Text(f"{self._stamp(time.time())}  {'status':<8}  {status_line(snapshot, self._alarm_prefix)}"))

    def _stamp(self, t: float) -> str:
        return f"+{t - self._timeline.started_at:6.1f}s"

    def _print(self, renderable: Any) -> None:
        with self._print_lock:
            self.console.print(renderable)

    def on_event(self, event: Event) -> None:
        text = Text(f"{self._stamp(event.t)}  ", style="dim")
        text.append(f"{event.kind.value:<8}  ", style=KIND_STYLES[event.kind])
        text.append(event.text)
        self._print(text)

    def on_slack(self, message: SlackMessage) -> None:
        self._print(slack_panel(message))
