"""Decision quality: the log cadence learned across decisions, lone signals that never nag, the evidence ladder's
rechecks, the straggler, and the sweeper's rule for deciding without an alarm."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest

from stallwatch.core import measures
from stallwatch.core.decision import Action, Diagnosis, JobState
from stallwatch.core.engine import decide, next_state, sweeper_due
from stallwatch.core.policy import Mode, Policy
from stallwatch.core.signals import HostSignals, JobSignals, Platform, Series
from tests.core.signals_builder import SignalsBuilder

MIN = 60.0
HOUR = 3_600.0
SWEEP = 5 * MIN
ENFORCE = Policy(mode=Mode.ENFORCE).for_job({"stallwatch:mode": "enforce"})


def rare_logger(every: float = 20 * MIN, end: float = 5 * HOUR) -> SignalsBuilder:
    """No agent: GPUs busy throughout, one log line every `every` seconds."""
    return SignalsBuilder(hosts=1).gpu(0, end, 97.0).logs(0, end, every)


def with_sawtooth(signals: JobSignals, every: float = SWEEP) -> JobSignals:
    """The signals plus the sweeper's LogIdleSeconds, published every `every` seconds from each host's log lines."""
    hosts = {}
    for name, host in signals.hosts.items():
        times = sorted(line.t for line in host.log_tail)
        points = []
        t = every
        while t <= signals.now:
            seen = [x for x in times if x <= t]
            if seen:
                points.append((t, t - seen[-1]))
            t += every
        hosts[name] = dataclasses.replace(host, log_idle=Series(tuple(points)))
    return dataclasses.replace(signals, hosts=hosts)


def tail_of_one_burst(signals: JobSignals) -> JobSignals:
    """What the AWS source reads: the log lines of the last 10 minutes before the quietest host's last event."""
    hosts = {
        name: dataclasses.replace(
            host, log_tail=tuple(line for line in host.log_tail if line.t >= host.log_last_t - 600)
        )
        for name, host in signals.hosts.items()
    }
    return dataclasses.replace(signals, hosts=hosts)


# --- the learned log cadence -------------------------------------------------------------------------------------


def test_the_sawtooths_resets_are_the_log_gaps() -> None:
    # Given LogIdleSeconds sampled every 5 min from a host logging every 20 min (lines at 0, 20, 40 min)
    host = HostSignals("algo-1", log_idle=Series(tuple((t * MIN, (t % 20) * MIN) for t in range(5, 56, 5))))
    # Then the longest gap it saw end is 20 minutes; the silence still going on (since 40 min) is not a gap yet
    assert measures.sawtooth_gap([host]) == pytest.approx(20 * MIN)


def test_the_job_is_silent_only_when_every_host_is() -> None:
    # Given two hosts: one silent for 30 min at a time, the other logging every 5 min (its idle never passes 5 min)
    quiet = HostSignals("algo-1", log_idle=Series(tuple((t * MIN, (t % 30) * MIN) for t in range(5, 91, 5))))
    chatty = HostSignals("algo-2", log_idle=Series(tuple((t * MIN, 0.0) for t in range(5, 91, 5))))
    # Then the job's gaps are the chatty host's
    assert measures.sawtooth_gap([quiet, chatty]) == pytest.approx(5 * MIN)


def test_a_rare_logger_is_not_a_hang_once_its_gaps_are_learned() -> None:
    # Given a job without the agent, busy GPUs, one line every 20 min; 16 min into a gap, 3 hours in
    now = 3 * HOUR + 16 * MIN
    full = rare_logger().build(now)
    signals = tail_of_one_burst(full)

    # When only the last 10 minutes of lines are known, one burst: the 15-minute floor decides (an alert)
    alone = decide(signals, ENFORCE, JobState(), now)
    assert (alone.diagnosis, alone.action) == (Diagnosis.HANG, Action.ALERT)

    # When the sweeper's 3-hour sawtooth holds the earlier gaps: 1.5 x 20 min is normal silence for this job
    learned = decide(tail_of_one_burst(with_sawtooth(full)), ENFORCE, JobState(), now)
    assert (learned.diagnosis, learned.action) == (Diagnosis.HEALTHY, Action.NONE)
    assert learned.evidence["logs"]["learned_gap_s"] == pytest.approx(20 * MIN)
    assert learned.evidence["logs"]["threshold_s"] == pytest.approx(30 * MIN)
    # And the state keeps the learned gap, so it outlives the lookback
    assert next_state(JobState(), learned).log_gap_s == pytest.approx(20 * MIN)


def test_the_remembered_gap_raises_the_threshold_and_only_ever_grows() -> None:
    # Given the state remembers a 20-minute gap and the metrics no longer hold it
    now = 3 * HOUR + 16 * MIN
    state = JobState(log_gap_s=20 * MIN)
    decision = decide(tail_of_one_burst(rare_logger().build(now)), ENFORCE, state, now)
    assert decision.diagnosis is Diagnosis.HEALTHY
    # And a decision that learned a shorter gap does not shrink it
    shorter = dataclasses.replace(decision, cadence=dataclasses.replace(decision.cadence, log_gap_s=5 * MIN))
    assert next_state(state, shorter).log_gap_s == pytest.approx(20 * MIN)


def test_a_warned_silence_that_recovers_teaches_the_threshold() -> None:
    # Given a job that logs every minute, then once is silent for 25 min on idle GPUs and comes back
    builder = SignalsBuilder(hosts=1).gpu(0, HOUR, 97.0).logs(0, HOUR, MIN)
    builder.gpu(HOUR, HOUR + 25 * MIN, 0.5).gpu(HOUR + 25 * MIN, 5 * HOUR, 97.0).logs(HOUR + 25 * MIN, 5 * HOUR, MIN)
    state, decisions = JobState(), []
    for now in (HOUR + 12 * MIN, HOUR + 30 * MIN):
        decision = decide(with_sawtooth(builder.build(now)), ENFORCE, state, now)
        state = next_state(state, decision)
        decisions.append(decision)

    # Then the silence is warned, the recovery clears the incident and remembers the 25-minute gap
    assert [(d.diagnosis, d.action) for d in decisions] == [
        (Diagnosis.IDLE, Action.WARN),
        (Diagnosis.HEALTHY, Action.NONE),
    ]
    assert state.warned_at is None
    assert state.log_gap_s == pytest.approx(25 * MIN, abs=SWEEP)


# --- lone signals and the evidence ladder ------------------------------------------------------------------------


def decisions_at(builder: SignalsBuilder, minutes_after: float, times: Iterable[float]):
    """The decisions at each of `times` (minutes after `minutes_after` minutes), the state carried between them."""
    state, decisions = JobState(), []
    for minutes in times:
        now = (minutes_after + minutes) * MIN
        decision = decide(builder.build(now), ENFORCE, state, now)
        state = next_state(state, decision)
        decisions.append(decision)
    return decisions


def test_busy_gpus_with_silent_logs_and_no_power_are_alerted_then_stopped_at_busy_silence_minutes() -> None:
    # Given a job without the agent or GPU power whose logs stop at 1 h while its GPUs stay busy (a hang, or an
    # evaluation that logs nothing), never silent with busy GPUs before
    builder = SignalsBuilder(hosts=2).gpu(0, 5 * HOUR, 97.0).logs(0, HOUR, MIN)
    decisions = decisions_at(builder, 60, (16, 29, 30, 35))
    # Then one alert at the log threshold, the warning at busy_silence_minutes (30) and the stop 5 minutes later:
    # within 45 minutes of the last line (behaviour change: 4 x the log threshold, 60 minutes, before)
    assert [d.action for d in decisions] == [Action.ALERT, Action.NONE, Action.WARN, Action.STOP]
    assert any("may be a long evaluation" in r for r in decisions[0].reasons)
    assert not decisions[0].stoppable
    assert decisions[1].recheck_at == pytest.approx(HOUR + 30 * MIN)
    # And the alert says that GPU power would have decided sooner
    assert any("no GPU power reported" in r and "3.0 min" in r for r in decisions[2].reasons)


def test_busy_gpus_with_silent_logs_and_power_that_holds_are_stopped_only_after_four_thresholds() -> None:
    # Given the same silence on EC2 whose CloudWatch agent reports GPU power, holding its baseline (compute runs)
    builder = SignalsBuilder(hosts=2, platform=Platform.EC2).gpu(0, 5 * HOUR, 97.0).logs(0, HOUR, MIN)
    builder.gpu_power(0, 5 * HOUR, 380.0)
    decisions = decisions_at(builder, 60, (16, 40, 61, 67))
    # Then an evaluation is as likely: one alert, the warning and the stop after 4 x 15 minutes
    assert [d.action for d in decisions] == [Action.ALERT, Action.NONE, Action.WARN, Action.STOP]


def test_a_job_that_came_back_from_a_long_busy_silence_may_be_as_silent_again() -> None:
    # Given a job without power that once evaluated 25 minutes without a line, GPUs busy, and came back (the
    # sweeper's sawtooth shows it), then falls silent again at 3 h with its GPUs busy
    builder = SignalsBuilder(hosts=1).gpu(0, 5 * HOUR, 97.0).logs(0, HOUR, MIN).logs(HOUR + 25 * MIN, 3 * HOUR, MIN)
    decisions = decisions_at(builder.sweeps(0, 5 * HOUR), 180, (31, 36, 37.5, 42.5))
    # Then it learned a busy silence of at least 20 minutes (the last sample that saw it silent) ...
    assert 20 * MIN <= decisions[0].cadence.busy_pause_s <= 25 * MIN
    # ... and is not warned before 1.5 x it: a second evaluation of the same length is never stopped
    stop_s = decisions[0].evidence["busy_silence"]["stop_s"]
    assert stop_s == pytest.approx(1.5 * decisions[0].cadence.busy_pause_s)
    assert decisions[0].action is not Action.WARN
    assert [d.action for d in decisions[2:]] == [Action.WARN, Action.STOP]


def test_a_job_that_logged_every_30_s_and_is_silent_30_minutes_with_pinned_gpus_is_stopped() -> None:
    # Given a job logging every 30 s for 3 hours (its gaps never longer), its GPUs busy throughout
    builder = SignalsBuilder(hosts=4).gpu(0, 5 * HOUR, 100.0).logs(0, 3 * HOUR, 30).sweeps(0, 5 * HOUR)
    # When its logs have been silent 30 minutes / Then it is warned as a hang, stoppable
    (decision,) = decisions_at(builder, 180, (30,))
    assert (decision.diagnosis, decision.action) == (Diagnosis.HANG, Action.WARN)


def test_a_rare_loggers_silence_with_busy_gpus_is_counted_from_the_line_it_owed() -> None:
    # Given a job without power that logs every 20 minutes, silent since 3 h with its GPUs busy
    builder = SignalsBuilder(hosts=1).gpu(0, 6 * HOUR, 97.0).logs(0, 3 * HOUR, 20 * MIN).sweeps(0, 6 * HOUR)
    early, warn = decisions_at(builder, 180, (45, 49))
    # Then not before 30 minutes past the line due at 3 h 20 (an evaluation that logs nothing has 30 minutes)
    assert early.action is not Action.WARN
    assert early.evidence["busy_silence"]["stop_s"] == pytest.approx(49 * MIN)
    assert (warn.diagnosis, warn.action) == (Diagnosis.HANG, Action.WARN)


def test_a_rare_loggers_restart_lines_seconds_apart_are_not_its_cadence() -> None:
    # Given a job without power that logs every 20 minutes on 2 hosts; at 40 min the launcher restarts its ranks
    # (algo-2's traceback, the launcher's warning, rendezvous and loading lines, seconds apart); from 1 h it evaluates
    # for 26 minutes without a line, GPUs busy, and its next line is due at 1 h 20 (Slurm's draw, fm-0527)
    builder = SignalsBuilder(hosts=2).gpu(0, 3 * HOUR, 97.0).logs(0, HOUR, 20 * MIN).sweeps(0, 3 * HOUR)
    for t in (40 * MIN + 10, 40 * MIN + 11, 40 * MIN + 30, 41 * MIN + 30):
        builder.log(t, "[rank 8] Rendezvous complete; restarting from checkpoint", "algo-2")
    (decision,) = decisions_at(builder, 60, (31,))
    # Then its cadence is the sawtooth's 20 minutes, not the restart's seconds: not warned 31 minutes into the
    # silence, stoppable only 30 minutes past the line it owed
    assert decision.action is not Action.WARN
    assert decision.evidence["busy_silence"]["stop_s"] >= 49 * MIN


def test_a_lone_silence_asks_to_be_decided_again_at_its_full_threshold() -> None:
    # Given busy GPUs and logs silent 11 minutes (the log-idle alarm fires at 2/3 of 15)
    builder = SignalsBuilder(hosts=1).gpu(0, 3 * HOUR, 97.0).logs(0, HOUR, MIN)
    decision = decide(builder.build(HOUR + 11 * MIN), ENFORCE, JobState(), HOUR + 11 * MIN)
    # Then nothing yet, and a recheck when the silence reaches 15 minutes
    assert (decision.diagnosis, decision.action) == (Diagnosis.HEALTHY, Action.NONE)
    assert decision.recheck_at == pytest.approx(HOUR + 15 * MIN)


def test_an_agreement_fraction_of_one_turns_the_ladder_off() -> None:
    # Given steps stopped and power fell on every host, 11 minutes ago
    builder = SignalsBuilder(hosts=2).progress(0, HOUR).no_progress(HOUR, 3 * HOUR).gpu(0, 3 * HOUR, 99.0)
    builder.power(0, HOUR, 350.0).power(HOUR, 3 * HOUR, 110.0)
    now = HOUR + 11 * MIN
    ladder_off = Policy(mode=Mode.ENFORCE, thresholds={"agreement_fraction": 1.0}).for_job(
        {"stallwatch:mode": "enforce"}
    )
    # Then the default ladder decides, and without it the full 15 minutes are waited for
    assert decide(builder.build(now), ENFORCE, JobState(), now).diagnosis is Diagnosis.HANG
    assert decide(builder.build(now), ladder_off, JobState(), now).diagnosis is Diagnosis.HEALTHY


# --- the straggler -----------------------------------------------------------------------------------------------


def straggling(factor: float, minutes: float, metric: str = "StepTime", base: float = 2.0) -> SignalsBuilder:
    """8 hosts stepping every 2 s; algo-6's own metric is `factor` x (StepTime) or / (power) the others' lately."""
    builder = SignalsBuilder(hosts=8).progress(0, 2 * HOUR, step_time=base).gpu(0, 2 * HOUR, 97.0)
    onset = 2 * HOUR - minutes * MIN
    builder.host_metric(metric, 0, 2 * HOUR, base, hosts=[h for h in builder.host_names if h != "algo-6"])
    lag = base * factor if metric == "StepTime" else base / factor
    builder.host_metric(metric, 0, onset, base, hosts=["algo-6"]).host_metric(metric, onset, 2 * HOUR, lag, ["algo-6"])
    return builder


@pytest.mark.parametrize(
    ("metric", "named"),
    [
        ("StepTime", "StepTime"),
        ("AcceleratorPowerWatts", "AcceleratorPowerWatts"),
        ("GPUPowerWatts", "AcceleratorPowerWatts"),  # an agent of the release before the rename
        ("AcceleratorPowerPercent", "AcceleratorPowerPercent"),  # a NeuronCore's power, in % of its maximum
    ],
)
def test_a_host_far_from_the_others_for_15_minutes_is_a_straggler_alerted_never_stopped(
    metric: str, named: str
) -> None:
    decision = decide(straggling(1.8, 20, metric).build(2 * HOUR), ENFORCE, JobState(), 2 * HOUR)
    assert (decision.diagnosis, decision.action, decision.stoppable) == (Diagnosis.STRAGGLER, Action.ALERT, False)
    lagging = decision.evidence["straggler"]
    assert (lagging["host"], lagging["metric"], lagging["ratio"]) == ("algo-6", named, pytest.approx(1.8))
    assert len(lagging["values"]) == 8
    assert "straggler algo-6" in decision.reasons[0]
    assert "algo-1 2 " in decision.reasons[0]  # the spread names every host


@pytest.mark.parametrize(("factor", "minutes"), [(1.1, 30), (1.8, 5)])
def test_a_small_or_short_lag_is_no_straggler(factor: float, minutes: float) -> None:
    decision = decide(straggling(factor, minutes).build(2 * HOUR), ENFORCE, JobState(), 2 * HOUR)
    assert decision.diagnosis is Diagnosis.HEALTHY


def test_a_host_lagging_for_less_than_the_window_asks_to_be_decided_when_its_window_fills() -> None:
    # Given algo-6 1.4x slower from 90 minutes in; 4 minutes later (the window is 10) it is not named yet
    builder, onset = straggling(1.4, 30), 90 * MIN
    early = decide(builder.build(onset + 4 * MIN), ENFORCE, JobState(), onset + 4 * MIN)
    assert early.diagnosis is Diagnosis.HEALTHY
    # Then the decision asks to be made again when the lag has filled the window: named then, not a minute before
    recheck = early.recheck_at
    assert recheck is not None
    assert onset + 10 * MIN <= recheck <= onset + 12 * MIN
    assert decide(builder.build(recheck - MIN), ENFORCE, JobState(), recheck - MIN).diagnosis is Diagnosis.HEALTHY
    named = decide(builder.build(recheck), ENFORCE, JobState(), recheck)
    assert (named.diagnosis, named.evidence["straggler"]["host"]) == (Diagnosis.STRAGGLER, "algo-6")


def test_a_512_host_jobs_straggler_is_named_over_its_5_minute_periods() -> None:
    # Given 512 hosts, whose per-host series come in 5-minute periods (one GetMetricData answer holds them), and
    # algo-7 1.65x slower for the last 20 minutes
    period, now, onset = 300.0, 2 * HOUR, 2 * HOUR - 20 * MIN
    builder = SignalsBuilder(hosts=512).progress(0, now, step_time=2.0).gpu(0, now, 97.0, every=period)
    others = [h for h in builder.host_names if h != "algo-7"]
    builder.host_metric("StepTime", 0, now, 2.0, hosts=others, every=period)
    builder.host_metric("StepTime", 0, onset, 2.0, ["algo-7"], every=period)
    builder.host_metric("StepTime", onset, now, 3.3, ["algo-7"], every=period)
    # Then it is named: its window spans 3 periods (15 minutes), not the 10 minutes two of them cannot fill
    decision = decide(builder.build(now), ENFORCE, JobState(), now)
    assert (decision.diagnosis, decision.evidence["straggler"]["host"]) == (Diagnosis.STRAGGLER, "algo-7")
    assert "for 15.0 min" in decision.reasons[0]


def test_a_healthy_cluster_asks_for_no_recheck() -> None:
    decision = decide(straggling(1.0, 30).build(2 * HOUR), ENFORCE, JobState(), 2 * HOUR)
    assert (decision.diagnosis, decision.recheck_at) == (Diagnosis.HEALTHY, None)


# --- the sweeper's rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "incident", "last", "due"),
    [
        (JobState(), False, 1_000.0, False),  # decided 100 s ago, nothing pending
        (JobState(), True, 1_000.0, True),  # an open incident
        (JobState(warned_at=900.0), False, 1_000.0, True),  # a warning waiting to become a stop
        (JobState(snoozed_until=1_050.0), False, 1_000.0, True),  # a snooze ran out
        (JobState(recheck_at=1_100.0), False, 1_000.0, True),  # a recheck the engine asked for
        (JobState(recheck_at=1_200.0), False, 1_000.0, False),  # ... not yet
        (JobState(), False, 1_100.0 - 1_800.0, True),  # a check-up: 30 min since the last decision
        (JobState(), False, None, False),  # never decided: its alarms' first decision comes first
    ],
)
def test_the_sweeper_decides_without_an_alarm_when(
    state: JobState, incident: bool, last: float | None, due: bool
) -> None:
    assert sweeper_due(state, incident, last, now=1_100.0, checkup_s=1_800.0) is due


def test_check_ups_can_be_turned_off() -> None:
    assert not sweeper_due(JobState(), False, 0.0, now=10 * HOUR, checkup_s=0)


def test_a_warned_stall_without_steps_that_recovers_is_not_warned_again() -> None:
    # Given steps stop for 14 min twice (an undeclared evaluation, GPU power down), at 1 h and at 2 h
    builder = SignalsBuilder(hosts=2).gpu(0, 4 * HOUR, 97.0).progress(0, HOUR).power(0, HOUR, 350.0)
    for start, end in ((HOUR, 2 * HOUR), (2 * HOUR, 4 * HOUR)):  # in time order: the builder counts the steps
        builder.no_progress(start, start + 14 * MIN).power(start, start + 14 * MIN, 110.0)
        builder.progress(start + 14 * MIN, end).power(start + 14 * MIN, end, 350.0)
    state, decisions = JobState(), []
    for now in (HOUR + 11 * MIN, HOUR + 20 * MIN, 2 * HOUR + 11 * MIN, 2 * HOUR + 13 * MIN):
        decision = decide(builder.build(now), ENFORCE, state, now)
        state = next_state(state, decision)
        decisions.append(decision)

    # Then the first is warned (two signals agree after 10 min) and recovers; the state keeps the stall it came back
    # from, and the second, as long, is normal for this job
    assert [d.action for d in decisions] == [Action.WARN, Action.NONE, Action.NONE, Action.NONE]
    assert decisions[1].diagnosis is Diagnosis.HEALTHY
    assert state.step_gap_s == pytest.approx(20 * MIN)  # at most: from the last step to the recovery decision
    assert decisions[2].evidence["agent"]["stall_threshold_s"] == pytest.approx(1.5 * 20 * MIN)
