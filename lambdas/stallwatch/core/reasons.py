"""The words of a decision's reasons: summaries of fatal lines, utilization, power and stragglers, and durations."""

from __future__ import annotations

from typing import Any

from stallwatch.core import measures
from stallwatch.core.signals import HostSignals, LogLine

SUMMARY_HOSTS = 4  # hosts named in a reason; the evidence has them all


def error_summary(errors: dict[str, list[LogLine]]) -> str:
    parts = [
        f"{name}: {', '.join(sorted({measures.fatal(line) or '' for line in lines}))}" for name, lines in errors.items()
    ]
    return "fatal error lines on " + "; ".join(sorted(parts))


def utilization_summary(hosts: dict[str, dict]) -> str:
    parts = [f"{name} {_pct(h['gpu_util_before'])} -> {_pct(h['gpu_util_now'])}" for name, h in sorted(hosts.items())]
    return "GPU utilization before -> now: " + (_first_hosts(parts) if parts else "no host metrics")


def straggler_summary(lagging: dict[str, Any], window_s: float) -> str:
    """Which host straggles, by how much, and every host's value (the spread a team cordons a node on)."""
    metric, host, values = lagging["metric"], lagging["host"], lagging["values"]
    unit, side = ("s", "slower") if metric == "StepTime" else ("W", "lower")
    spread = ", ".join(f"{h} {v:g} {unit}" for h, v in values.items())
    return (
        f"straggler {host}: {metric} {values[host]:g} {unit} against a median of {lagging['others_median']:g} {unit} "
        f"on the other {len(values) - 1} hosts ({lagging['ratio']:g}x {side}) for {minutes(window_s)}; "
        f"per host: {spread}"
    )


def power_summary(hosts: dict[str, dict]) -> str | None:
    known = {name: h for name, h in hosts.items() if h["power_w_baseline"] is not None and h["power_w_now"] is not None}
    if not known:
        return None
    dropped = sum(h["power_dropped"] for h in known.values())
    parts = [  # in W, or in % of the device's maximum (a NeuronCore's)
        f"{n} {h['power_w_baseline']:.0f} {h['power_unit']} -> {h['power_w_now']:.0f} {h['power_unit']}"
        for n, h in sorted(known.items())
    ]
    return f"GPU power dropped on {dropped}/{len(known)} hosts: {_first_hosts(parts)}"


def _first_hosts(parts: list[str]) -> str:
    """The first few hosts' details; the evidence has them all."""
    more = [f"+{len(parts) - SUMMARY_HOSTS} more"] if len(parts) > SUMMARY_HOSTS else []
    return ", ".join(parts[:SUMMARY_HOSTS] + more)


def host_count(hosts: list[HostSignals]) -> str:
    return "1 host" if len(hosts) == 1 else f"{len(hosts)} hosts"


def duration(seconds: float) -> str:
    """Seconds for step-sized durations, minutes beyond two."""
    return f"{seconds:.3g} s" if seconds < 120 else minutes(seconds)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def number(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"
