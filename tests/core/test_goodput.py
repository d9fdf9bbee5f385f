"""Goodput against a run whose split of time is known by construction: a hang, a stop, a restart, redone steps."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from stallwatch.core.goodput import SCHEDULER_CATEGORIES, Category, JobSpan, Window, measure_goodput, run_timeline
from stallwatch.core.pricing import instance_spec

TYPE = "ml.p4d.24xlarge"  # 8 GPUs, priced
PERIOD = 60.0


def stepping(start: float, count: int, first_step: float, steps: float = 10.0, tflops: float = 100.0) -> list[Window]:
    """`count` one-minute windows from `start`, `steps` steps each, from `first_step` on."""
    return [
        Window(
            start + k * PERIOD,
            start + (k + 1) * PERIOD,
            steps,
            first_step + steps * (k + 1),
            tflops_per_gpu=tflops,
            mfu=tflops / 3.12,
        )
        for k in range(count)
    ]


def quiet(start: float, count: int, step: float, in_phase: bool = False) -> list[Window]:
    return [Window(start + k * PERIOD, start + (k + 1) * PERIOD, 0.0, step, in_phase=in_phase) for k in range(count)]


def known_run() -> list[JobSpan]:
    """Job 1: 600 s startup, 1800 s of steps (0 -> 300), a 120 s checkpoint, 360 s of steps (-> 360), a hang from
    2880 to Stallwatch's stop at 3600, 400 s stopping. A 300 s gap. Job 2 (from the checkpoint at step 300):
    600 s startup, 660 s of steps (300 -> 410: 60 redone, 50 new), then 440 s without a step."""
    first = JobSpan(
        name="llama",
        instance_type=TYPE,
        hosts=1,
        created=0.0,
        ended=4000.0,
        windows=(
            *stepping(600, 30, 0),
            *quiet(2400, 2, 300, in_phase=True),
            *stepping(2520, 6, 300),
            *quiet(2880, 12, 360),
        ),
        stall=(2880.0, 3600.0),
    )
    second = JobSpan(
        name="llama-r1",
        instance_type=TYPE,
        hosts=1,
        created=4300.0,
        ended=6000.0,
        windows=(*stepping(4900, 11, 300, tflops=120.0), *quiet(5560, 7, 410)),
    )
    return [second, first]  # any order


def test_the_split_of_a_known_run() -> None:
    goodput = measure_goodput("llama", known_run())

    seconds = {c: t.seconds for c, t in goodput.totals.items()}
    assert seconds == pytest.approx(
        {
            Category.PRODUCTIVE: 1800 + 360 + 300,
            Category.REDONE: 360,
            Category.STARTUP: 1200,
            Category.PHASES: 120,
            Category.STALLS: 720,
            Category.RESTART_GAPS: 400 + 300,
            Category.OTHER: 440,
        }
    )
    assert sum(seconds.values()) == pytest.approx(goodput.wall_s)
    assert goodput.wall_s == 6000
    assert goodput.ratio == pytest.approx(2460 / 6000)
    assert (goodput.jobs, goodput.restarts, goodput.stalls_caught) == (("llama", "llama-r1"), 1, 1)
    assert (goodput.redone_steps, goodput.final_step) == (60, 410)


def test_a_datapoint_stored_twice_counts_its_steps_once() -> None:
    # Given the known run whose resumed job's second window (steps 310 -> 320, trained again) was stored twice, as a
    # PutMetricData retried after a lost answer is: Sum(Steps) 20, Maximum(Step) still 320
    first, second = sorted(known_run(), key=lambda j: j.created)
    doubled = list(second.windows)
    doubled[1] = Window(doubled[1].start, doubled[1].end, 20.0, doubled[1].step, tflops_per_gpu=120.0)
    run = [first, replace(second, windows=tuple(doubled))]

    # When its goodput is measured, Then the window starts where the one before it ended: nothing changes
    goodput = measure_goodput("llama", run)
    expected = measure_goodput("llama", known_run())
    assert (goodput.redone_steps, goodput.final_step) == (60, 410)
    assert {c: t.seconds for c, t in goodput.totals.items()} == pytest.approx(
        {c: t.seconds for c, t in expected.totals.items()}
    )


def test_a_restart_within_a_job_counts_from_the_step_each_window_reports() -> None:
    # Given a run that reached step 100, and its resumed job that trained again from 50 to 100, then restarted in
    # place from its checkpoint at 80 (a step lower than the window before it) and trained on to 120
    first = JobSpan("llama", TYPE, hosts=1, created=0.0, ended=700.0, windows=tuple(stepping(100, 10, 0)))
    windows = (*stepping(800, 5, 50), *stepping(1200, 4, 80))
    second = JobSpan("llama-r1", TYPE, hosts=1, created=700.0, ended=1440.0, windows=windows)

    # When its goodput is measured, Then the restart's windows start where each says (80, 90): 50 + 20 steps redone
    goodput = measure_goodput("llama", [first, second])
    assert (goodput.redone_steps, goodput.final_step) == (70, 120)
    assert goodput.totals[Category.REDONE].seconds == pytest.approx(7 * PERIOD)


def test_the_timeline_is_the_split_in_time_covering_the_run_once() -> None:
    # Given the known run, When its timeline is taken
    segments = run_timeline(known_run())

    # Then it covers the run from the first creation to the last end, each second once, in time order
    assert (segments[0].start, segments[-1].end) == (0.0, 6000.0)
    assert all(a.end == pytest.approx(b.start) for a, b in itertools.pairwise(segments))
    # And its seconds per category are the totals; the gap between the jobs is the only time no job holds instances
    goodput = measure_goodput("llama", known_run())
    per_category = {c: sum(s.seconds for s in segments if s.category is c) for c in goodput.totals}
    assert {s.category for s in segments} <= set(goodput.totals)
    assert per_category == pytest.approx({c: t.seconds for c, t in goodput.totals.items()})
    unheld = [(s.attempt, s.start, s.end, s.category) for s in segments if not s.held]
    assert unheld == [(0, 4000.0, 4300.0, Category.RESTART_GAPS)]
    assert {s.attempt for s in segments if s.start >= 4300} == {1}


def test_gpu_hours_and_dollars_count_only_while_instances_are_held() -> None:
    goodput = measure_goodput("llama", known_run())
    spec = instance_spec(TYPE)

    # the 300 s between the jobs is wall time, but nobody pays for it
    assert goodput.gpu_hours == pytest.approx(5700 * spec.devices / 3600)
    assert goodput.dollars == pytest.approx(5700 * spec.usd_per_hour / 3600)
    stalls = goodput.totals[Category.STALLS]
    assert stalls.gpu_hours == pytest.approx(720 * spec.devices / 3600)
    assert stalls.dollars == pytest.approx(720 * spec.usd_per_hour / 3600)
    gaps = goodput.totals[Category.RESTART_GAPS]
    assert gaps.gpu_hours == pytest.approx(400 * spec.devices / 3600)


def test_throughput_is_averaged_over_the_time_with_steps() -> None:
    goodput = measure_goodput("llama", known_run())
    assert goodput.mean_tflops_per_gpu == pytest.approx((36 * 100 + 11 * 120) / 47)
    assert goodput.mean_mfu == pytest.approx((36 * 100 + 11 * 120) / 47 / 3.12)


def test_a_run_without_the_agent_is_startup_then_other_and_unknown_types_cost_nothing() -> None:
    job = JobSpan("plain", "ml.unknown.2xlarge", hosts=2, created=0, ended=100, training_started=30)
    goodput = measure_goodput("plain", [job])
    assert goodput.totals[Category.STARTUP].seconds == 30
    assert goodput.totals[Category.OTHER].seconds == 70
    assert goodput.ratio == 0
    assert goodput.dollars is None
    assert goodput.mean_tflops_per_gpu is None


def test_a_run_without_jobs_is_an_error() -> None:
    with pytest.raises(ValueError, match="no jobs"):
        measure_goodput("none", [])


def ec2_run() -> list[JobSpan]:
    """An EC2 group (2 x p4d.24xlarge, 1 x p5.48xlarge) as two attempts of one run: 600 s startup, 3000 s of steps
    (0 -> 300), a hang from 3600 to Stallwatch's stop at 4800 (which ends the attempt: EC2 bills no stopping
    instance); StartInstances 120 s later; 300 s startup, 600 s of steps from the checkpoint at 200 (200 -> 400:
    100 redone), 120 s until the group is stopped."""
    fleet = {"p4d.24xlarge": 2, "p5.48xlarge": 1}
    return [
        JobSpan(
            "llm-70b",
            "p4d.24xlarge",
            hosts=3,
            created=0.0,
            ended=4800.0,
            windows=(*stepping(600, 50, 0, steps=6.0), *quiet(3600, 20, 300)),
            stall=(3600.0, 4800.0),
            fleet=fleet,
        ),
        JobSpan(
            "llm-70b (restart 1)", "p4d.24xlarge", 3, 4920.0, 5940.0, tuple(stepping(5220, 10, 200, 20.0)), fleet=fleet
        ),
    ]


def test_an_ec2_run_of_a_heterogeneous_group_is_priced_per_type_and_unbilled_between_attempts() -> None:
    goodput = measure_goodput("llm-70b", ec2_run())

    seconds = {c: t.seconds for c, t in goodput.totals.items()}
    assert seconds == pytest.approx(
        {
            Category.PRODUCTIVE: 3000 + 300,
            Category.REDONE: 300,
            Category.STARTUP: 600 + 300,
            Category.PHASES: 0,
            Category.STALLS: 1200,
            Category.RESTART_GAPS: 120,
            Category.OTHER: 120,
        }
    )
    assert goodput.wall_s == 5940
    assert (goodput.restarts, goodput.stalls_caught, goodput.redone_steps, goodput.final_step) == (1, 1, 100, 400)
    per_hour = 2 * instance_spec("p4d.24xlarge").usd_per_hour + instance_spec("p5.48xlarge").usd_per_hour
    billed = 5940 - 120
    assert goodput.gpu_hours == pytest.approx(billed * 24 / 3600)
    assert goodput.dollars == pytest.approx(billed * per_hour / 3600)
    assert goodput.totals[Category.RESTART_GAPS].gpu_hours == 0
    assert goodput.totals[Category.STALLS].dollars == pytest.approx(1200 * per_hour / 3600)


def test_one_unpriced_type_in_the_group_leaves_the_dollars_unknown() -> None:
    job = JobSpan("mixed", "p4d.24xlarge", hosts=2, created=0, ended=3600, fleet={"p4d.24xlarge": 1, "x9.weird": 1})
    assert measure_goodput("mixed", [job]).dollars is None


# ---- a scheduler's holds (a Slurm job's run) ----------------------------------------------------------------------


def slurm_run() -> list[JobSpan]:
    """Attempt 1: submitted at 0, pending until 300, stepping until 1500 (0 -> 200), suspended from 1500 to 2100,
    stepping to 2400 (-> 250), requeued by someone else (preempted) at 2400. Attempt 2: requeued at 2400, pending until
    2700, stepping to 3300 (250 -> 350), past its time limit from 3300 until Slurm ended it at 3400."""
    first = JobSpan(
        name="pc1-7-llm",
        instance_type=TYPE,
        hosts=1,
        created=300.0,
        ended=2400.0,
        windows=(*stepping(300, 20, 0), *stepping(2100, 5, 200)),
        submitted=0.0,
        gap=Category.PENDING,
        held=((1500.0, 2100.0, Category.SUSPENDED),),
    )
    second = JobSpan(
        name="pc1-7-llm (restart 1)",
        instance_type=TYPE,
        hosts=1,
        created=2700.0,
        ended=3400.0,
        windows=tuple(stepping(2700, 10, 250)),
        submitted=2400.0,
        gap=Category.REQUEUED,
        held=((3300.0, 3400.0, Category.TIME_LIMIT),),
    )
    return [first, second]


def test_a_schedulers_holds_are_each_their_own_badput_and_only_held_time_is_paid() -> None:
    goodput = measure_goodput("pc1-7-llm", slurm_run())
    seconds = {c: round(t.seconds) for c, t in goodput.totals.items() if t.seconds}
    assert seconds == {
        Category.PENDING: 300,  # in the queue before its first nodes
        Category.PRODUCTIVE: 2100,
        Category.SUSPENDED: 600,
        Category.REQUEUED: 300,  # from the requeue to the next attempt's nodes
        Category.TIME_LIMIT: 100,
    }
    assert goodput.wall_s == 3400.0  # from the submission
    assert goodput.totals[Category.PENDING].gpu_hours == goodput.totals[Category.REQUEUED].gpu_hours == 0.0
    assert goodput.totals[Category.SUSPENDED].gpu_hours > 0  # a suspended job holds its nodes


def test_a_run_without_holds_keeps_the_categories_it_always_had() -> None:
    assert set(measure_goodput("llama", known_run()).totals) == set(Category) - SCHEDULER_CATEGORIES
