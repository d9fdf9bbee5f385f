"""Progress of long CLI work, drawn by rich on the terminal's stderr and cleared when done; nothing at all when the
output is piped or redirected, or with ``--json``.

    with WorkProgress(quiet=args.json) as progress:
        for path in progress.over(paths, "replaying"):          # a bar: one step per trace
            ...
        with progress.aws_calls(clients.session, "exporting my-job"):
            export_trace(...)                                   # every AWS call (a page) counted as it is made

AWS calls are counted from botocore's ``after-call`` events on the session, so the work itself knows nothing of the
progress shown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

T = TypeVar("T")
AFTER_CALL = "after-call"
OPERATIONS_SHOWN = 3  # the busiest operations named in the line
ITEM_KEYS = ("events", "MetricDataResults", "Items")  # what a page holds, counted as read


class WorkProgress:
    """A rich progress display on stderr, live only when both stdout and stderr are terminals and not `quiet`."""

    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        shown = not quiet and self.console.is_terminal and Console().is_terminal
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not shown,
        )

    @property
    def shown(self) -> bool:
        return not self.progress.disable

    def __enter__(self) -> WorkProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def over(self, items: Sequence[T], description: str, name: Any = str) -> Iterator[T]:
        """Each of `items` in turn, the bar advancing after each; the line names the one at work (`name(item)`)."""
        task = self.progress.add_task(description, total=len(items))
        for item in items:
            self.progress.update(task, description=f"{description} {name(item)}")
            yield item
            self.progress.advance(task)

    @contextmanager
    def aws_calls(self, session: Any, description: str) -> Iterator[Counter[str]]:
        """Count the AWS calls made while inside by the clients the boto3 `session` creates from now on (each takes
        a copy of the session's handlers when it is created); yields the counts, by operation."""
        calls: Counter[str] = Counter()
        read = 0
        counting = True
        task = self.progress.add_task(description, total=None)

        def counted(event_name: str, parsed: Any = None, **_: Any) -> None:
            nonlocal read
            if not counting:  # a client made inside keeps its copy of this handler
                return
            calls[event_name.rsplit(".", 1)[-1]] += 1
            read += sum(len(parsed.get(key) or ()) for key in ITEM_KEYS) if isinstance(parsed, dict) else 0
            busiest = ", ".join(f"{op} {n}" for op, n in calls.most_common(OPERATIONS_SHOWN))
            self.progress.update(task, advance=1, description=f"{description}: {busiest}; {read:,} read")

        session.events.register(AFTER_CALL, counted)
        try:
            yield calls
        finally:
            counting = False
            session.events.unregister(AFTER_CALL, counted)
