"""The latency targets of a fatal line's wake-up (issue 29, item 4), replayed as the Lambdas run: a crash with fatal
last words and no agent, its peers spinning, stopped within 6 minutes of the line (median); every host's NCCL watchdog
lines as its last words, stopped within 5 minutes of them (each). `bench/wake_latency.py` prints the same cases."""

from __future__ import annotations

import functools

from bench import wake_latency
from bench.wake_latency import CRASH, WATCHDOG
from stallwatch.offline.replay import replay
from stallwatch.offline.trace_file import load_trace

MIN = 60.0
UNSUBSCRIBED = wake_latency.UNSUBSCRIBED


@functools.cache
def measured() -> tuple[wake_latency.Measured, ...]:
    return tuple(wake_latency.measure(case) for case in wake_latency.cases())


def test_a_crash_with_fatal_last_words_is_stopped_within_6_minutes_of_the_line_at_the_median() -> None:
    figures = wake_latency.summary(list(measured()))
    assert figures[CRASH]["cases"] >= 5
    assert figures[CRASH]["worst"] is not None  # every case stopped
    assert figures[CRASH]["median"] <= 6.0


def test_watchdog_lines_as_every_hosts_last_words_are_stopped_within_5_minutes_of_them() -> None:
    watchdogs = [m for m in measured() if m.case.family == WATCHDOG]
    assert len(watchdogs) >= 3
    assert all(m.minutes is not None and m.minutes <= 5.0 for m in watchdogs), [
        (m.case.name, m.minutes) for m in watchdogs
    ]
    assert wake_latency.missed(wake_latency.summary(list(measured()))) == []


def test_the_held_out_kind_of_hang_is_stopped_within_15_minutes_of_its_onset_only_with_the_subscription() -> None:
    # Given 4 hosts without the agent hung at 50 min, every host's watchdog lines their last words 10 minutes later
    trace = load_trace(wake_latency.WATCHDOG_TRACE)
    onset, lines = 3_000.0, 3_600.0
    # When replayed with the fatal lines' subscription, and without it (the alarms and the sweeper alone)
    woken, unwoken = replay(trace), replay(trace, config=UNSUBSCRIBED)
    # Then the wake-up warns a minute after the lines and stops within 15 minutes of the onset; without it, the
    # sweeper's first decision comes minutes after the lines and the stop after 15 minutes
    assert woken.decisions[0].t <= lines + 65
    assert woken.first_stop_s - lines <= 5 * MIN
    assert woken.first_stop_s - onset <= 15 * MIN
    assert unwoken.first_stop_s - onset > 15 * MIN
    assert woken.verdict.value == "pass"


def test_a_burst_of_every_hosts_lines_wakes_one_decision() -> None:
    # Given the 8-host watchdog case: 8 hosts' lines within 2 s, each delivered on its own
    case = next(c for c in wake_latency.cases() if c.name == "sm-8host-watchdog")
    # When replayed, Then they woke one decision
    assert replay(case.trace).wake_ups == 1
