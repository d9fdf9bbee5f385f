"""The run's verdict and what it means in GPU-hours and dollars.

Savings assumption: without Stallwatch a stalled job holds its instances until its MaxRuntimeInSeconds
(SageMaker's default, 24 h; an EC2 cluster is assumed to be left as long), so the stop saves the rest of that
runtime. Prices are on-demand list prices from `stallwatch.core.pricing`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from stallwatch.core.goodput import Goodput
from stallwatch.core.pricing import estimate_burn


@dataclass(frozen=True)
class Savings:
    """What the stop saved, and what the stall burned before it, at the job's instance type."""

    instance_type: str
    hosts: int
    horizon_s: float  # the runtime the stalled job would otherwise have kept (MaxRuntimeInSeconds)
    saved_gpu_hours: float
    saved_dollars: float | None
    burned_gpu_hours: float  # fault onset -> stop
    burned_dollars: float | None

    @classmethod
    def estimate(
        cls, instance_type: str, hosts: int, horizon_s: float, job_age_at_stop_s: float, stall_s: float
    ) -> Savings:
        saved = estimate_burn(instance_type, hosts, horizon_s - job_age_at_stop_s)
        burned = estimate_burn(instance_type, hosts, stall_s)
        return cls(
            instance_type=instance_type,
            hosts=hosts,
            horizon_s=horizon_s,
            saved_gpu_hours=saved.device_hours,
            saved_dollars=saved.dollars,
            burned_gpu_hours=burned.device_hours,
            burned_dollars=burned.dollars,
        )


@dataclass(frozen=True)
class RunResult:
    """Everything the run established; `passed` decides the exit code."""

    scenario: str
    job_name: str
    expected: str
    passed: bool
    verdict: str
    job_status: str
    fault_onset: float | None
    stop_requested_at: float | None
    detection_latency_s: float | None
    training_exit_codes: dict[str, int | None]
    training_pids: dict[str, int | None]
    slack_messages: int
    decisions: list[dict[str, Any]]
    moto_port: int
    slack_port: int
    duration_s: float
    savings: Savings | None = None
    errors: list[str] = field(default_factory=list)
    resumed_as: str | None = None  # --resume: the job Stallwatch started from the checkpoint
    resumed_status: str | None = None
    follow_ups: list[str] = field(default_factory=list)  # Slack's follow-ups: resumed, progress, gave up
    goodput: Goodput | None = None
    restarted_in_place: list[str] = field(default_factory=list)  # --recover: nodes whose training restarted
    taken_out: list[str] = field(default_factory=list)  # --recover: bad nodes stopped while the job ran on
    recovery_steps: list[dict[str, Any]] = field(default_factory=list)  # the sweeper's steps of the recovery

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"goodput": self.goodput.as_json() if self.goodput else None}


def _money(value: float | None) -> str:
    return "n/a (no price)" if value is None else f"${value:,.2f}"


def summary_table(result: RunResult) -> Table:
    """The final summary as a two-column table."""
    table = Table(title=f"Stallwatch local run: {result.scenario}", show_header=False, title_justify="left")
    table.add_column(style="dim")
    table.add_column()
    table.add_row("result", f"[bold {'green' if result.passed else 'red'}]{result.verdict}[/]")
    table.add_row("expected", result.expected)
    table.add_row("job", f"{result.job_name}: {result.job_status} (in moto)")
    if result.detection_latency_s is not None:
        table.add_row("detection latency", f"{result.detection_latency_s:.1f} s from fault onset to the stop request")
    table.add_row("Slack messages", str(result.slack_messages))
    table.add_row("decisions", ", ".join(f"{d.get('diagnosis')}→{d.get('action')}" for d in result.decisions) or "-")
    if result.resumed_as is not None:
        table.add_row("resumed as", f"{result.resumed_as}: {result.resumed_status} (in moto)")
    if result.restarted_in_place:
        table.add_row("restarted in place", ", ".join(result.restarted_in_place))
    if result.taken_out:
        table.add_row("taken out", ", ".join(result.taken_out))
    for text in result.follow_ups:
        table.add_row("Slack follow-up", text)
    if result.savings is not None:
        s = result.savings
        table.add_row(
            "saved",
            f"{s.saved_gpu_hours:,.1f} GPU-hours ≈ {_money(s.saved_dollars)} "
            f"({s.hosts} x {s.instance_type}, the rest of a {s.horizon_s / 3600:.0f} h run)",
        )
        table.add_row("burned while stalled", f"{s.burned_gpu_hours:.2f} GPU-hours ≈ {_money(s.burned_dollars)}")
    table.add_row("wall time", f"{result.duration_s:.1f} s")
    for error in result.errors:
        table.add_row("error", f"[red]{error}[/]")
    return table
