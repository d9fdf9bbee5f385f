"""Scale: the AWS calls of one sweep over 10, 100 and 1,000 running jobs, of a cold sweep, of on_alarm on 1 to 512
hosts (and on EC2 jobs of 512 and 1,000 nodes), and of an alarm burst on a 64-host hang, on moto.

    .venv/bin/python bench/scale.py                 # everything (about 16 minutes on 2 cores)
    .venv/bin/python bench/scale.py --only on_alarm --hosts 1 64
    .venv/bin/python bench/scale.py --only on_alarm_ec2 --nodes 512 1000

Calls are counted by operation with botocore ``before-call`` hooks on every client the runtime uses (one per API
call, each page its own call; DescribeAlarms asks 100 alarms a page, AWS's most, and `localrun.moto_alarm_filters`
pages them as CloudWatch does). GetMetricData's datapoints are counted too: AWS answers at most 100,800 a call and
pages the rest (``aws_pages``), which moto does not. The
critical path counts the calls made one after another (the sweep's own thread's, and the busiest worker's: the 16
workers run side by side), at 80 ms a call; moto's own time is not AWS's, and moto serves one call at a time. The
bench exits non-zero if a goal is missed:

- one sweep at 10 % due, the hourly one that lists every alarm and the others alike, makes <= 150 + 6 x due calls
  as AWS pages, and its critical path at 80 ms a call stays under 60 s;
- a cold sweep over 1,000 jobs decides before it puts any alarm, puts at most 450 alarms (150 s at
  PutMetricAlarm's 3 a second), and the sweeps that follow put the rest;
- on_alarm (warn, then stop) makes <= 10 calls for every cluster size, a warm container (EC2: a cold one);
- 65 alarms of a 64-host hang cost <= 3 full signal reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]

import moto  # noqa: E402

from bench.decision_cost import SERVICES, _setup  # noqa: E402  (its import sets the environment moto needs)
from handlers import on_alarm, on_job_state, sweeper  # noqa: E402
from localrun import (  # noqa: E402
    moto_alarm_filters,
    moto_logs_filter,
    moto_logs_insights,
    moto_metric_index,
    moto_metric_search,
    moto_sagemaker,
    moto_threads,
)
from localrun.moto_world import (  # noqa: E402
    MINUTE,
    LambdaContext,
    World,
    alarm_event,
    job_state_event,
    scheduled_event,
)
from localrun.slack_receiver import SlackReceiver  # noqa: E402
from stallwatch.aws.job_states import StoredState  # noqa: E402
from stallwatch.aws.observability import metrics  # noqa: E402
from stallwatch.aws.store import job_key  # noqa: E402
from stallwatch.core import alarms, contract  # noqa: E402
from stallwatch.core.decision import JobState  # noqa: E402
from stallwatch.core.platforms.ec2 import EC2  # noqa: E402
from stallwatch.core.reading import LOOKBACK_SECONDS, METRIC_PERIOD_SECONDS, host_period  # noqa: E402
from stallwatch.core.signals import Platform  # noqa: E402
from stallwatch.runtime import environment, provision, sweep  # noqa: E402

DUE_SHARE = 0.10
HOST_MIX = (1, 2, 4, 4)  # hosts per job, in turn: 1,000 jobs are 2,750 hosts, as in the issue
LATENCY_S = 0.080
MAIN_THREAD = "MainThread"
SWEEP_CALLS_FIXED = 150
SWEEP_CALLS_PER_DUE = 6
CRITICAL_PATH_S = 60.0
ON_ALARM_CALLS = 10
BURST_READS = 3
DATAPOINTS_PER_CALL = 100_800  # GetMetricData's answer limit; AWS pages beyond it
ALARMS_PER_SWEEP = 450
LATER = "2026-11-30T10:06:00.000+0000"  # the stop's alarm, 6 minutes after the warning's


@dataclass
class Calls:
    """Every AWS call the runtime makes while counting, by operation, with GetMetricData's datapoints."""

    by_op: Counter[str] = field(default_factory=Counter)
    by_thread: Counter[str] = field(default_factory=Counter)
    order: list[str] = field(default_factory=list)
    datapoints: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before(self, model: Any, **_: Any) -> None:
        with self.lock:
            self.by_op[model.name] += 1
            self.by_thread[threading.current_thread().name] += 1
            self.order.append(model.name)

    def after(self, model: Any, parsed: dict[str, Any], **_: Any) -> None:
        if model.name == "GetMetricData":
            with self.lock:
                self.datapoints.append(sum(len(r.get("Values", [])) for r in parsed.get("MetricDataResults", [])))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def critical_calls(self) -> int:
        """Calls one after another: the sweep's own thread's, plus the busiest worker's (each worker decides its
        jobs one after another; the workers run side by side)."""
        workers = [n for thread, n in self.by_thread.items() if thread != MAIN_THREAD]
        return self.by_thread[MAIN_THREAD] + max(workers, default=0)

    def aws_pages(self) -> int:
        """GetMetricData calls as AWS would answer them (100,800 datapoints a page)."""
        return sum(max(1, math.ceil(n / DATAPOINTS_PER_CALL)) for n in self.datapoints)

    def calls_on_aws(self) -> int:
        """Every call, GetMetricData counted in the pages AWS would answer."""
        return self.total - self.by_op["GetMetricData"] + self.aws_pages()

    def report(self) -> dict[str, Any]:
        return {
            "calls": self.total,
            "by_api": dict(sorted(self.by_op.items())),
            "metric_datapoints": sum(self.datapoints),
            "get_metric_data_aws_pages": self.aws_pages(),
            "calls_on_aws": self.calls_on_aws(),
        }


@contextmanager
def counting(rt: environment.Runtime) -> Iterator[Calls]:
    calls = Calls()
    clients = [getattr(rt.clients, service) for service in SERVICES]
    for client in clients:
        client.meta.events.register("before-call", calls.before)
        client.meta.events.register("after-call", calls.after)
    try:
        yield calls
    finally:
        for client in clients:
            client.meta.events.unregister("before-call", calls.before)
            client.meta.events.unregister("after-call", calls.after)


@contextmanager
def moto_world() -> Iterator[tuple[environment.Runtime, World]]:
    with moto.mock_aws(), SlackReceiver() as slack:
        rt = _setup(slack)
        yield rt, World(rt.clients, now=rt.clock())


def _healthy(world: World, job: str, hosts: int, minutes: int = 30) -> None:
    """Steps every minute, GPUs busy, and a log line a minute on every host, until now."""
    world.steps_until(job, last_step_min=0, start_min=minutes)
    for i in range(1, hosts + 1):
        world.host_gpu(job, f"algo-{i}", world.every_minute(minutes, 95.0, end_min=0))
        world.logs(job, f"algo-{i}", [(m, f"step {minutes - m} loss 2.3") for m in range(minutes, 0, -1)])


def _seed_running(rt: environment.Runtime, world: World, jobs: int, provisioned: bool) -> list[str]:
    """`jobs` running jobs (hosts in turn from HOST_MIX), each host with a recent log line; the due ones (10 %)
    have an open incident and their metrics; all have their alarms (and markers) if `provisioned`."""
    names, due = [], []
    for i, hosts in zip(range(jobs), itertools.cycle(HOST_MIX), strict=False):
        name = f"job-{i:04d}"
        world.create_job(name, hosts=hosts, tags={"stallwatch:mode": "enforce"})
        names.append(name)
        if i % round(1 / DUE_SHARE) == 0:
            due.append(name)
            _healthy(world, name, hosts)
            key = job_key(Platform.SAGEMAKER, name)
            opened = StoredState(JobState(), 0, f"incident#{rt.clock() - 600:017.3f}")
            rt.states.commit(key, StoredState(), opened, {"diagnosis": "hang"}, rt.clock() - 600)
        else:
            for h in range(1, hosts + 1):
                world.logs(name, f"algo-{h}", [(1, "step 100 loss 2.3")])
        if provisioned:
            provision.provision_alarms(rt, Platform.SAGEMAKER, name, budget=10_000)
    metrics.clear_metrics()  # the seeding's own AlarmsPut
    return due


def bench_sweep(jobs: int, hourly: bool) -> dict[str, Any]:
    """One steady-state sweep over `jobs` running jobs, 10 % due: the hourly one that lists every alarm, or one of
    the others (another sweep listed them a minute ago)."""
    with moto_world() as (rt, world):
        due = _seed_running(rt, world, jobs, provisioned=True)
        if not hourly:
            rt.alarm_markers.claim_audit(rt.clock() - MINUTE, sweep.ALARM_AUDIT_SECONDS)
        with counting(rt) as calls:
            start = time.perf_counter()
            summary = sweeper.handler(scheduled_event(), LambdaContext())
            seconds = time.perf_counter() - start
    outcomes = Counter(f"{o['status']} {o.get('action', '')}".strip() for o in summary["redecided"])
    return {
        "jobs": jobs,
        "sweep": "hourly (every alarm listed)" if hourly else "the others (alarms in ALARM only)",
        "hosts": sum(h for _, h in zip(range(jobs), itertools.cycle(HOST_MIX), strict=False)),
        "due": len(due),
        "redecided": dict(outcomes),
        **calls.report(),
        "budget": SWEEP_CALLS_FIXED + SWEEP_CALLS_PER_DUE * len(due),
        "critical_path_calls": calls.critical_calls(),
        "critical_path_s_at_80ms": round(calls.critical_calls() * LATENCY_S, 1),
        "wall_s_on_moto": round(seconds, 1),
    }


def bench_cold_sweep(jobs: int) -> dict[str, Any]:
    """A new deployment: `jobs` running jobs, none with alarms, 10 % with an open incident; sweeps until every job
    has its alarms."""
    with moto_world() as (rt, world):
        due = _seed_running(rt, world, jobs, provisioned=False)
        sweeps = []
        while len(sweeps) < 100:
            with counting(rt) as calls:
                summary = sweeper.handler(scheduled_event(), LambdaContext())
            first_put = calls.order.index("PutMetricAlarm") if "PutMetricAlarm" in calls.order else len(calls.order)
            decided = [i for i, op in enumerate(calls.order) if op == "TransactWriteItems"]
            sweeps.append(
                {
                    "calls": calls.total,
                    "alarms_put": calls.by_op["PutMetricAlarm"],
                    "decided": len(summary["redecided"]),
                    "errors": [o for o in summary["redecided"] if o["status"] != "decided"],
                    "decided_before_alarms": all(i < first_put for i in decided),
                    "left": summary["left_to_provision"],
                }
            )
            rt.clock.advance(5 * MINUTE)
            if summary["left_to_provision"] == 0:
                break
    first = sweeps[0]
    return {
        "jobs": jobs,
        "due": len(due),
        "sweeps_to_provision_all": len(sweeps),
        "first_sweep": first,
        "most_calls_in_a_sweep": max(s["calls"] for s in sweeps),
        "most_alarms_in_a_sweep": max(s["alarms_put"] for s in sweeps),
        "alarm_seconds_at_3_tps": round(max(s["alarms_put"] for s in sweeps) / 3, 1),
    }


def _seed_hang(world: World, job: str, hosts: int, busy: int = 0, last_words: str | None = None) -> None:
    """A hang 40 minutes ago on every host but `busy` of them, which keep stepping and logging every 10 s; the hung
    hosts' logs end 10 minutes ago with `last_words`, if given."""
    world.create_job(job, hosts=hosts, tags={"stallwatch:mode": "enforce"})
    world.steps_until(job, last_step_min=40, start_min=110)
    for i in range(1, hosts + 1):
        host = f"algo-{i}"
        hung = i > busy
        world.host_gpu(job, host, world.every_minute(110, 100.0))
        power = (lambda m: 390.0 if m > 40 else 95.0) if hung else 390.0
        world.agent_host(job, host, "GPUPowerWatts", world.every_minute(110, power))
        if hung:
            world.progress_logs(job, host, until_min=40, extra=[(10, last_words)] if last_words else [])
        else:
            world.logs(job, host, [(m / 6, f"rank {i} step {180 - m} loss 2.3") for m in range(180, -1, -1)])


def bench_on_alarm(hosts: int) -> dict[str, Any]:
    """A hung `hosts`-host job (its alarms put when it started) after a sweep (which publishes the hosts' log
    idleness): on_alarm warns, then 6 minutes later stops; the container is warm (a first decision on another job
    read the Slack secret)."""
    job = f"hang-{hosts}"
    with moto_world() as (rt, world):
        _seed_hang(world, "warm-up", 1)
        _seed_hang(world, job, hosts)
        on_job_state.handler(job_state_event(job, "InProgress", hosts=hosts), LambdaContext())
        sweeper.handler(scheduled_event(), LambdaContext())
        rt.clock.advance(MINUTE)  # the alarm comes after the sweep that published the hosts' log idleness
        prefix = rt.config.alarm_prefix
        on_alarm.handler(
            alarm_event(alarms.alarm_name(prefix, "sagemaker", "warm-up", alarms.PROGRESS)), LambdaContext()
        )
        results = _warn_then_stop(rt, "sagemaker", job, "algo-1")
    return {"hosts": hosts, **results}


def _warn_then_stop(rt: environment.Runtime, platform: str, job: str, host: str) -> dict[str, Any]:
    """on_alarm on the job's progress alarm, then 6 minutes later on `host`'s gpu-idle alarm: each one's calls."""
    prefix = rt.config.alarm_prefix
    results = {}
    for action, event in (
        ("warn", alarm_event(alarms.alarm_name(prefix, platform, job, alarms.PROGRESS))),
        ("stop", alarm_event(alarms.alarm_name(prefix, platform, job, alarms.GPU_IDLE, host), LATER)),
    ):
        with counting(rt) as calls:
            start = time.perf_counter()
            result = on_alarm.handler(event, LambdaContext())
            seconds = time.perf_counter() - start
        results[action] = {"action": result.get("action"), "seconds": round(seconds, 2)} | calls.report()
        rt.clock.advance(6 * MINUTE)
    return results


def bench_on_alarm_ec2(nodes: int) -> dict[str, Any]:
    """A hung EC2 job of `nodes` instances (`World.hung_ec2_cluster`), no sweep yet, in a cold container: on_alarm
    warns, then 6 minutes later stops; "every series full" is the datapoints of the job's 13 series and its 8 a node
    over the lookback at the hosts' period, as AWS would answer them."""
    job = f"hang-ec2-{nodes}"
    with moto_world() as (rt, world):
        instances = world.hung_ec2_cluster(job, nodes)
        results = {"nodes": nodes, **_warn_then_stop(rt, "ec2", job, instances[0])}
    period = host_period(nodes, METRIC_PERIOD_SECONDS, EC2.host_series_read)
    full = len(contract.JOB_METRICS) * (LOOKBACK_SECONDS // 60) + nodes * EC2.host_series_read * (
        LOOKBACK_SECONDS // period
    )
    return results | {"hosts_period_s": period, "every_series_full": full, "pages_on_aws": math.ceil(full / 100_800)}


def bench_log_freshness(hosts: int) -> dict[str, Any]:
    """A cluster where every host but one is busy (a line every 10 s) and one is silent for 40 minutes: how old the
    newest tail line of the busy hosts is, and the log calls of one read."""
    job = f"busy-{hosts}"
    with moto_world() as (rt, world):
        _seed_hang(world, job, hosts, busy=hosts - 1)
        sweeper.handler(scheduled_event(), LambdaContext())
        rt.clock.advance(MINUTE)  # the alarm comes after the sweep that published the hosts' log idleness
        now = rt.clock()
        with counting(rt) as calls:
            signals = rt.source(Platform.SAGEMAKER).job_signals(job, now)
    busy = [h for name, h in signals.hosts.items() if name != f"algo-{hosts}"]
    quiet = signals.hosts[f"algo-{hosts}"]
    return {
        "hosts": hosts,
        "busy_tail_age_s": round(max(now - h.log_tail[-1].t for h in busy), 1)
        if all(h.log_tail for h in busy)
        else None,
        "busy_hosts_with_tail": sum(1 for h in busy if h.log_tail),
        "quiet_host_silence_s": round(now - quiet.log_last_t, 1) if quiet.log_last_t else None,
        "quiet_host_tail_lines": len(quiet.log_tail),
        "log_calls": calls.by_op["FilterLogEvents"],
    }


CRASH_LINE = "[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered"


def bench_crash_among_busy(hosts: int) -> dict[str, Any]:
    """Every host but one busy (a line every 10 s for 3 hours), the last dead 10 minutes ago after a CUDA error, and
    no sweep yet (no host's freshness known; its alarms were put when it started): on_alarm's whole decision, the
    job's first, in a warm container (a first decision on another job read the Slack secret), and whether it read
    the dead host's line."""
    job = f"crash-{hosts}"
    with moto_world() as (rt, world):
        _seed_hang(world, "warm-up", 1)
        _seed_hang(world, job, hosts, busy=hosts - 1, last_words=CRASH_LINE.format(rank=8 * (hosts - 1)))
        on_job_state.handler(job_state_event(job, "InProgress", hosts=hosts), LambdaContext())
        warm_up = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", "warm-up", alarms.PROGRESS)
        on_alarm.handler(alarm_event(warm_up), LambdaContext())
        with counting(rt) as calls:
            result = on_alarm.handler(
                alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, alarms.PROGRESS)),
                LambdaContext(),
            )
        audit = rt.audit.records(job_key(Platform.SAGEMAKER, job), "audit")[-1]
    errors = audit["record"]["evidence"]["hosts"][f"algo-{hosts}"]["errors"]
    return {
        "hosts": hosts,
        "diagnosis": result.get("diagnosis"),
        "action": result.get("action"),
        "fatal_line_read": any(e["pattern"] == "illegal_memory_access" for e in errors),
        "log_calls": calls.by_op["FilterLogEvents"],
    } | calls.report()


def bench_burst(hosts: int = 64) -> dict[str, Any]:
    """A `hosts`-host hang fires every host's gpu-idle alarm and the progress alarm, spread over two minutes."""
    job = f"burst-{hosts}"
    with moto_world() as (rt, world):
        _seed_hang(world, job, hosts)
        sweeper.handler(scheduled_event(), LambdaContext())
        rt.clock.advance(MINUTE)  # the alarm comes after the sweep that published the hosts' log idleness
        prefix = rt.config.alarm_prefix
        names = [alarms.alarm_name(prefix, "sagemaker", job, alarms.PROGRESS)]
        names += [
            alarms.alarm_name(prefix, "sagemaker", job, alarms.GPU_IDLE, f"algo-{i}") for i in range(1, hosts + 1)
        ]
        statuses: Counter[str] = Counter()
        with counting(rt) as calls:
            for name in names:
                statuses[on_alarm.handler(alarm_event(name), LambdaContext())["status"]] += 1
                rt.clock.advance(120 / len(names))
    return {
        "hosts": hosts,
        "alarms": len(names),
        "full_signal_reads": calls.by_op["DescribeTrainingJob"],
        "statuses": dict(statuses),
        "calls": calls.total,
        "by_api": dict(sorted(calls.by_op.items())),
    }


BENCHES: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]]] = {
    "sweep": lambda a: [bench_sweep(n, hourly) for n in a.jobs for hourly in (False, True)],
    "cold_sweep": lambda a: [bench_cold_sweep(max(a.jobs))],
    "on_alarm": lambda a: [bench_on_alarm(h) for h in a.hosts],
    "on_alarm_ec2": lambda a: [bench_on_alarm_ec2(n) for n in a.nodes],
    "log_freshness": lambda a: [bench_log_freshness(h) for h in (64, 512) if h <= max(a.hosts)],
    "crash_among_busy": lambda a: [bench_crash_among_busy(h) for h in (64, 512) if h <= max(a.hosts)],
    "burst": lambda a: [bench_burst()],
}


def _goals(results: dict[str, list[dict[str, Any]]]) -> dict[str, bool]:
    goals = {}
    for r in results.get("sweep", []):
        which = f"sweep {r['jobs']} jobs, {r['sweep']}"
        on_aws = r["calls_on_aws"]
        goals[f"{which}: {on_aws} <= {r['budget']} calls as AWS pages"] = on_aws <= r["budget"]
        path = r["critical_path_s_at_80ms"]
        goals[f"{which}: critical path {path} s < 60 s at 80 ms a call"] = path < CRITICAL_PATH_S
    for r in results.get("cold_sweep", []):
        ok = r["first_sweep"]["decided_before_alarms"] and r["most_alarms_in_a_sweep"] <= ALARMS_PER_SWEEP
        goals[f"cold sweep {r['jobs']} jobs: decides first, <= {ALARMS_PER_SWEEP} alarms a sweep"] = ok
    for r in results.get("on_alarm", []):
        for action in ("warn", "stop"):
            calls = r[action]["calls"]
            goals[f"on_alarm {r['hosts']} hosts {action}: {calls} <= {ON_ALARM_CALLS} calls"] = calls <= ON_ALARM_CALLS
            # as AWS would answer: GetMetricData pages of 100,800 datapoints (moto has no such limit)
            on_aws = r[action]["calls_on_aws"]
            goals[f"on_alarm {r['hosts']} hosts {action}: {on_aws} <= {ON_ALARM_CALLS} calls as AWS pages"] = (
                on_aws <= ON_ALARM_CALLS
            )
    for r in results.get("on_alarm_ec2", []):
        for action in ("warn", "stop"):
            calls = r[action]["calls"]
            ok = calls <= ON_ALARM_CALLS and r["pages_on_aws"] == 1
            goals[f"on_alarm EC2 {r['nodes']} nodes {action}: {calls} <= {ON_ALARM_CALLS} calls, one answer"] = ok
    for r in results.get("crash_among_busy", []):
        found = r["fatal_line_read"] and r["calls"] <= ON_ALARM_CALLS
        goals[f"crash among {r['hosts']} busy hosts: error line read in {r['calls']} <= {ON_ALARM_CALLS} calls"] = found
    for r in results.get("burst", []):
        reads = r["full_signal_reads"]
        goals[f"burst {r['alarms']} alarms: {reads} <= {BURST_READS} full reads"] = reads <= BURST_READS
    return goals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(BENCHES), nargs="*", default=sorted(BENCHES))
    parser.add_argument("--jobs", type=int, nargs="*", default=[10, 100, 1000])
    parser.add_argument("--hosts", type=int, nargs="*", default=[1, 8, 64, 128, 512])
    parser.add_argument("--nodes", type=int, nargs="*", default=[512, 1000])
    args = parser.parse_args(argv)
    moto_sagemaker.install()
    moto_metric_index.install()
    moto_metric_search.install()
    moto_logs_insights.install()
    moto_alarm_filters.install()
    moto_logs_filter.install()
    moto_threads.install()
    results = {}
    for name in args.only:
        results[name] = BENCHES[name](args)
        print(json.dumps({name: results[name]}, indent=1), flush=True)
    goals = _goals(results)
    print(json.dumps({"goals": goals}, indent=1))
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
