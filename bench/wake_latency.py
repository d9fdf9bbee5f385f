"""How soon a fatal line stops a job without the agent, now that the line wakes the engine (issue 29, item 4).

    .venv/bin/python bench/wake_latency.py          # the table of docs/benchmarks.md; exits 1 if a goal is missed
    .venv/bin/python bench/wake_latency.py --json

Each case is a corpus-like job (`corpus.generate`) replayed through the alarms, rechecks, sweeper and the
subscription's wake-ups, as the Lambdas run them (`stallwatch.offline.replay`, enforce): its fatal lines reach the
log group, are delivered `core.wake.DELIVERY_DELAY_S` later, and wake a decision. Latency counts from the first fatal
line to the stop, beside the same case replayed without the subscription (the alarms, rechecks and sweeper alone).
Goals: a crash with fatal last words and its peers spinning, stopped within 6 minutes of the line
(median of the cases); every host's NCCL watchdog lines as its last words, stopped within 5 minutes of them (each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "lambdas")]

from corpus import generate  # noqa: E402
from corpus.generate import BUSY, HUNG, NCCL_CRASH, NCCL_WATCHDOG, OOM_AND_ABORT, XID_79, Scenario, Segment  # noqa: E402
from stallwatch.core import wake  # noqa: E402
from stallwatch.core.config import StallwatchConfig  # noqa: E402
from stallwatch.core.log_patterns import BUILT_IN, FATAL_FILTER_PATTERN  # noqa: E402
from stallwatch.core.platforms import ec2_clusters as clusters  # noqa: E402
from stallwatch.core.signals import Platform  # noqa: E402
from stallwatch.core.trace import LogEvent, Trace  # noqa: E402
from stallwatch.offline.replay import ReplayResult, replay  # noqa: E402
from stallwatch.offline.trace_file import load_trace  # noqa: E402

MINUTE = 60.0
CRASH = "crash"  # a rank's fatal last words, its GPUs dead, its peers spinning in the collective
WATCHDOG = "watchdog"  # a hang: every host's NCCL watchdog lines are its last words
GOALS = {CRASH: ("median", 6.0), WATCHDOG: ("worst", 5.0)}  # minutes from the first fatal line to the stop
WATCHDOG_TRACE = generate.TRACES_DIR / "sm-hang-watchdog-4host-noagent.jsonl"
UNSUBSCRIBED = StallwatchConfig.model_validate(
    {"platforms": {"sagemaker": {"log_subscription": False}, "ec2": {"log_subscription": False}}}
)
CUDA_OOM = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.1 GiB"
]
LAUNCH_FAILURE = ["RuntimeError: CUDA error: unspecified launch failure", "Traceback (most recent call last):"]


@dataclass(frozen=True)
class Case:
    """One job: its family (CRASH or WATCHDOG), a name, and its trace."""

    family: str
    name: str
    trace: Trace


@dataclass(frozen=True)
class Measured:
    case: Case
    line_s: float  # the first fatal line (trace seconds)
    stop_s: float | None
    unsubscribed_stop_s: float | None  # the stop without the subscription: the alarms, rechecks and sweeper alone

    @property
    def minutes(self) -> float | None:
        return None if self.stop_s is None else (self.stop_s - self.line_s) / MINUTE

    @property
    def unsubscribed_minutes(self) -> float | None:
        return None if self.unsubscribed_stop_s is None else (self.unsubscribed_stop_s - self.line_s) / MINUTE


def _trace(sc: Scenario) -> Trace:
    sim = generate.Simulation(sc)
    return Trace(header=sim.header(), events=sorted(sim.run(), key=lambda e: e.t), source=sc.name)


def _crash(name: str, platform: Platform, hosts: int, at: float, words: list[str], **shape: object) -> Case:
    sm = platform is Platform.SAGEMAKER
    sc = Scenario(
        name=name,
        summary="a rank dies with fatal last words; its peers spin in the collective; no agent",
        platform=platform,
        instance_type=str(shape.pop("instance_type", "ml.p4d.24xlarge" if sm else "p4d.24xlarge")),
        hosts=hosts,
        agent=False,
        segments=[*generate._start(360.0), Segment(at, HUNG, logs=False)] if sm else _ec2_start(at),
        duration_s=at + 40 * MINUTE,
        seed=int(at),
        crash=(at, hosts // 2, words),
        tags={} if sm else {clusters.JOB_TAG: name},
        **shape,  # type: ignore[arg-type]
    )
    return Case(CRASH, name, _trace(sc))


def _watchdog(name: str, platform: Platform, hosts: int, onset: float, spread_s: float, **shape: object) -> Case:
    sm = platform is Platform.SAGEMAKER
    fired = onset + 10 * MINUTE  # NCCL's default collective timeout
    sc = Scenario(
        name=name,
        summary="a collective hangs; 10 minutes later every host's NCCL watchdog times out; no agent",
        platform=platform,
        instance_type=str(shape.pop("instance_type", "ml.p4d.24xlarge" if sm else "p4d.24xlarge")),
        hosts=hosts,
        agent=False,
        segments=[*generate._start(300.0), Segment(onset, HUNG, logs=False)] if sm else _ec2_start(onset),
        duration_s=fired + 40 * MINUTE,
        seed=int(onset),
        lines=tuple((fired + h * spread_s / hosts, h, NCCL_WATCHDOG.format(rank=8 * h)) for h in range(hosts)),
        tags={} if sm else {clusters.JOB_TAG: name},
        **shape,  # type: ignore[arg-type]
    )
    return Case(WATCHDOG, name, _trace(sc))


def _ec2_start(onset: float) -> list[Segment]:
    return [Segment(0.0, BUSY, step_s=2.1), Segment(onset, HUNG, logs=False)]


def cases() -> list[Case]:
    """Crashes and watchdog hangs on SageMaker and EC2, 2 to 8 hosts, their lines at various seconds of a minute
    (a crash after its host's line of that minute: the simulator writes one at 20 s)."""
    return [
        _crash("sm-8host-illegal-access", Platform.SAGEMAKER, 8, 4_110.0, NCCL_CRASH),
        _crash("sm-8host-illegal-access-late", Platform.SAGEMAKER, 8, 4_196.0, NCCL_CRASH),
        _crash("sm-4host-xid79", Platform.SAGEMAKER, 4, 3_037.0, XID_79),
        _crash("sm-2host-p5-cuda-oom", Platform.SAGEMAKER, 2, 5_066.0, CUDA_OOM, instance_type="ml.p5.48xlarge"),
        _crash("ec2-4node-oom-rank0-logs", Platform.EC2, 4, 2_429.0, OOM_AND_ABORT, log_hosts=(0,)),
        _crash("ec2-8node-launch-failure", Platform.EC2, 8, 1_953.0, LAUNCH_FAILURE),
        Case(WATCHDOG, WATCHDOG_TRACE.stem, load_trace(WATCHDOG_TRACE)),
        _watchdog("sm-8host-watchdog", Platform.SAGEMAKER, 8, 3_333.0, spread_s=2.0),
        _watchdog("sm-2host-p5-watchdog", Platform.SAGEMAKER, 2, 2_048.0, spread_s=0.5, instance_type="ml.p5.48xlarge"),
        _watchdog("ec2-4node-watchdog", Platform.EC2, 4, 2_771.0, spread_s=1.0),
    ]


def measure(case: Case) -> Measured:
    """The case replayed: the first line the subscription delivers, and the stop with and without it (trace s)."""
    result: ReplayResult = replay(case.trace)
    unsubscribed = replay(case.trace, config=UNSUBSCRIBED)
    lines = [
        e.t
        for e in case.trace.events
        if isinstance(e, LogEvent) and wake.delivered(e.log.message, FATAL_FILTER_PATTERN, BUILT_IN)
    ]
    return Measured(case, min(lines), result.first_stop_s, unsubscribed.first_stop_s)


def summary(measured: list[Measured]) -> dict[str, dict[str, float | None]]:
    """Per family: the median and the worst minutes from the line to the stop (None: a case never stopped)."""
    out: dict[str, dict[str, float | None]] = {}
    for family in GOALS:
        minutes = [m.minutes for m in measured if m.case.family == family]
        stopped = [m for m in minutes if m is not None]
        out[family] = {
            "median": statistics.median(stopped) if stopped else None,
            "worst": max(stopped) if len(stopped) == len(minutes) else None,
            "cases": len(minutes),
        }
    return out


def missed(figures: dict[str, dict[str, float | None]]) -> list[str]:
    """The goals the figures miss."""
    return [
        f"{family}: {stat} {figures[family][stat]} min, goal <= {goal:g}"
        for family, (stat, goal) in GOALS.items()
        if figures[family][stat] is None or figures[family][stat] > goal  # type: ignore[operator]
    ]


def _cell(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


def _min(value: float | None) -> str:
    return "never stopped" if value is None else f"{value:.2f} min"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    measured = [measure(case) for case in cases()]
    figures = summary(measured)
    if args.json:
        rows = [
            {"case": m.case.name, "family": m.case.family, "minutes": m.minutes, "unsubscribed": m.unsubscribed_minutes}
            for m in measured
        ]
        print(json.dumps({"cases": rows, "summary": figures}, indent=1))
    else:
        print("| case | family | first fatal line → stop (min) | without the subscription |\n|---|---|---|---|")
        for m in measured:
            print(f"| {m.case.name} | {m.case.family} | {_cell(m.minutes)} | {_cell(m.unsubscribed_minutes)} |")
        for family, stats in figures.items():
            print(f"\n{family}: median {_min(stats['median'])}, worst {_min(stats['worst'])}, {stats['cases']} cases")
    failures = missed(figures)
    for failure in failures:
        print(f"goal missed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
