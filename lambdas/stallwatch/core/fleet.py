"""Goodput across the fleet: every watched run's GPU time, split by `core.goodput.Category` and summed by platform,
instance type and team, and the runs whose badput cost most (`stallwatch report --fleet`, the fleet dashboard).

Pure. A run is kept as a `RunRecord` when it ends (`runtime.run_goodput`; a run still going is measured as it
stands). The fleet's goodput is productive GPU-hours over the GPU-hours paid for (a run's own goodput is over its wall
time: the fleet sums what was paid); badput is every other category, a run's cost of it in dollars (GPU-hours where a
type has no list price).

    run = RunRecord.of(goodput, spans, "ec2", tags)       # measured from `spans` (`measure_goodput`'s)
    fleet = fleet_goodput([run, ...])
    fleet.totals[Category.STALLS].gpu_hours, fleet.ratio
    fleet.groups["team"]["vision"].ratio          # by platform, instance type, team
    fleet.costliest(10)                           # the runs whose badput cost most
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stallwatch.core.goodput import Category, Goodput, JobSpan, Total

# The team a run counts under: its `stallwatch:team` tag, else a `team` tag many accounts already carry; else none.
TEAM_TAGS = ("stallwatch:team", "team")
NO_TEAM = "(no team)"
# The groupings of the fleet report and the dashboard, each a `RunRecord` field.
GROUPINGS = ("platform", "instance_type", "team")


def team_of(tags: Mapping[str, str]) -> str:
    return next((tags[key].strip() for key in TEAM_TAGS if tags.get(key, "").strip()), NO_TEAM)


def instance_types(spans: Sequence[JobSpan]) -> dict[str, int]:
    """A run's instance types, each with the most hosts an attempt had of it."""
    found: dict[str, int] = {}
    for span in spans:
        for instance_type, hosts in span.instance_types().items():
            found[instance_type] = max(found.get(instance_type, 0), hosts)
    return found


def fleet_label(instance_types: Mapping[str, int]) -> str:
    """ "p5.48xlarge", or a heterogeneous run's types joined: "ml.c5.4xlarge+ml.p4d.24xlarge"."""
    return "+".join(sorted(instance_types)) or "unknown"


@dataclass(frozen=True)
class RunRecord:
    """One run's goodput as the fleet counts it: where it ran, whose it was, and its split by category."""

    run: str
    platform: str
    team: str
    instance_type: str  # `fleet_label` of its instance types
    started: float
    ended: float
    wall_s: float
    jobs: int
    totals: dict[Category, Total] = field(default_factory=dict)
    stalls_caught: int = 0
    running: bool = False  # measured while it runs: not recorded yet

    @classmethod
    def of(
        cls, goodput: Goodput, spans: Sequence[JobSpan], platform: str, tags: Mapping[str, str], running: bool = False
    ) -> RunRecord:
        """The run `goodput` measured from `spans` (`measure_goodput`'s), on `platform`, tagged `tags`."""
        started = min(span.begins for span in spans)
        return cls(
            run=goodput.run,
            platform=platform,
            team=team_of(tags),
            instance_type=fleet_label(instance_types(spans)),
            started=started,
            ended=started + goodput.wall_s,
            wall_s=goodput.wall_s,
            jobs=len(goodput.jobs),
            totals=dict(goodput.totals),
            stalls_caught=goodput.stalls_caught,
            running=running,
        )

    @property
    def gpu_hours(self) -> float:
        return sum(t.gpu_hours for t in self.totals.values())

    @property
    def badput(self) -> Total:
        return _sum(t for c, t in self.totals.items() if c is not Category.PRODUCTIVE)

    @property
    def ratio(self) -> float:
        """Productive GPU-hours over GPU-hours paid for (0 for a run that held no instance)."""
        productive = self.totals.get(Category.PRODUCTIVE, Total()).gpu_hours
        return productive / self.gpu_hours if self.gpu_hours > 0 else 0.0

    @property
    def top_cause(self) -> Category | None:
        """The badput category that held the most GPU-hours (wall time for a run that held none)."""
        causes = [(t.gpu_hours, t.seconds, c) for c, t in self.totals.items() if c is not Category.PRODUCTIVE]
        best = max(causes, default=None, key=lambda x: (x[0], x[1]))
        return best[2] if best is not None and (best[0] > 0 or best[1] > 0) else None

    def as_json(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in self.__dataclass_fields__ if name != "totals"},
            "totals": {c.value: vars(t) for c, t in self.totals.items()},
            "goodput": self.ratio,
            "gpu_hours": self.gpu_hours,
        }

    @classmethod
    def of_json(cls, data: Mapping[str, Any]) -> RunRecord:
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data and name != "totals"}
        totals = {Category(c): Total(**t) for c, t in data.get("totals", {}).items()}
        return cls(**fields, totals=totals)


@dataclass(frozen=True)
class Group:
    """Runs counted together (a platform's, a team's, ...): how many, and their split by category."""

    runs: int = 0
    totals: dict[Category, Total] = field(default_factory=dict)

    def plus(self, run: RunRecord) -> Group:
        totals = dict(self.totals)
        for category, total in run.totals.items():
            totals[category] = totals.get(category, Total()).plus(total.seconds, total.gpu_hours, total.dollars)
        return Group(self.runs + 1, totals)

    @property
    def gpu_hours(self) -> float:
        return sum(t.gpu_hours for t in self.totals.values())

    @property
    def dollars(self) -> float | None:
        known = [t.dollars for t in self.totals.values() if t.dollars is not None]
        return sum(known) if known else None

    @property
    def ratio(self) -> float:
        """Productive GPU-hours over GPU-hours paid for."""
        productive = self.totals.get(Category.PRODUCTIVE, Total()).gpu_hours
        return productive / self.gpu_hours if self.gpu_hours > 0 else 0.0

    @property
    def badput(self) -> Total:
        return _sum(t for c, t in self.totals.items() if c is not Category.PRODUCTIVE)


@dataclass(frozen=True)
class FleetGoodput:
    """The fleet's runs, their sum (`total`), and their sums by each of `GROUPINGS` (`groups[grouping][value]`)."""

    runs: tuple[RunRecord, ...]
    total: Group
    groups: dict[str, dict[str, Group]]

    @property
    def totals(self) -> dict[Category, Total]:
        return self.total.totals

    @property
    def ratio(self) -> float:
        return self.total.ratio

    def costliest(self, count: int) -> list[RunRecord]:
        """The `count` runs whose badput cost most: dollars where every run is priced, else GPU-hours."""
        priced = all(r.badput.dollars is not None for r in self.runs)
        cost = (lambda r: r.badput.dollars or 0.0) if priced else (lambda r: r.badput.gpu_hours)
        return sorted(self.runs, key=lambda r: (-cost(r), r.run))[:count]

    def as_json(self, top: int) -> dict[str, Any]:
        def group(g: Group) -> dict[str, Any]:
            totals = {c.value: vars(t) for c, t in g.totals.items()}
            figures = {"runs": g.runs, "gpu_hours": g.gpu_hours, "dollars": g.dollars, "goodput": g.ratio}
            return figures | {"totals": totals}

        return {
            "runs": len(self.runs),
            **group(self.total),
            "by": {name: {key: group(g) for key, g in found.items()} for name, found in self.groups.items()},
            "costliest": [r.as_json() for r in self.costliest(top)],
        }


def fleet_goodput(runs: Iterable[RunRecord]) -> FleetGoodput:
    """The runs' sum, and their sums by platform, instance type and team."""
    ordered = tuple(sorted(runs, key=lambda r: (r.ended, r.run)))
    total = Group()
    groups: dict[str, dict[str, Group]] = {name: {} for name in GROUPINGS}
    for run in ordered:
        total = total.plus(run)
        for name in GROUPINGS:
            key = getattr(run, name)
            groups[name][key] = groups[name].get(key, Group()).plus(run)
    return FleetGoodput(ordered, total, groups)


def _sum(totals: Iterable[Total]) -> Total:
    found = Total()
    for total in totals:
        found = found.plus(total.seconds, total.gpu_hours, total.dollars)
    return found
