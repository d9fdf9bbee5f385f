"""How the CLI writes what it measures: durations as h:mm:ss, dollars, and the goodput categories' names.

hms(5025.0), money(1234.5), LABELS[Category.STALLS]   # "1:23:45", "$1,234.50", "stalls (onset to stop)"
"""

from __future__ import annotations

from stallwatch.core.goodput import Category

LABELS = {
    Category.PRODUCTIVE: "productive steps (goodput)",
    Category.REDONE: "steps redone after a restart",
    Category.STARTUP: "startup and download",
    Category.PHASES: "declared phases (checkpoint, eval)",
    Category.STALLS: "stalls (onset to stop)",
    Category.RESTART_GAPS: "restart gaps",
    Category.PENDING: "pending in the scheduler's queue",
    Category.SUSPENDED: "suspended by the scheduler",
    Category.PREEMPTED: "preempted, until it ran again",
    Category.REQUEUED: "requeued, until it ran again",
    Category.TIME_LIMIT: "past its time limit",
    Category.OTHER: "other",
}


def hms(seconds: float | None) -> str:
    """Seconds as h:mm:ss ("-" for None)."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def money(dollars: float | None) -> str:
    """Dollars as $1,234.56 ("n/a" when unknown: an instance type without a price)."""
    return "n/a" if dollars is None else f"${dollars:,.2f}"
