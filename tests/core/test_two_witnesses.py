"""Two witnesses before any stop (issue 37), and the early alerts (issue 42): a fatal line is a hypothesis, alerted
with its words, until a witness the job's printing cannot supply confirms it (its GPUs, a vanished host, the agent
gone, the step or line its cadence owes); each rule decides at the moment it turns decisive (`recheck_at`)."""

from __future__ import annotations

import pytest

from corpus.generate import IN_DATALOADER, stack_dumps
from stallwatch.core import evidence
from stallwatch.core.decision import Action, Decision, Diagnosis, JobState
from stallwatch.core.diagnosis import UNCONFIRMED
from stallwatch.core.engine import decide, next_state
from stallwatch.core.measures import Limits
from stallwatch.core.policy import Mode, Policy
from tests.core.signals_builder import SignalsBuilder
from tests.core.test_cadence import with_sawtooth
from trainer_agent.stack_dumps import STALL, StackDump

MIN = 60.0
HOUR = 3600.0
ONSET = 2 * HOUR
ENFORCE = Policy(mode=Mode.ENFORCE).for_job({"stallwatch:mode": "enforce"})
TRACEBACK = ("Traceback (most recent call last):", "AssertionError: can only join a child process")
WATCHDOG = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=5121, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600031 milliseconds "
    "before timing out."
)


def at(builder: SignalsBuilder, now: float, state: JobState | None = None, sawtooth: bool = True) -> Decision:
    signals = builder.build(now)
    return decide(with_sawtooth(signals) if sawtooth else signals, ENFORCE, state or JobState(), now)


def said(builder: SignalsBuilder, t: float, lines: tuple[str, ...], hosts: list[str]) -> SignalsBuilder:
    for host in hosts:
        for line in lines:
            builder.log(t, line.format(rank=8 * builder.host_names.index(host)), host)
    return builder


# --- without the agent ---------------------------------------------------------------------------------------------


def test_a_traceback_on_every_host_with_busy_gpus_is_alerted_and_stopped_only_when_its_silence_is_owed() -> None:
    # Given 2 hosts without the agent or power, a line a minute, GPUs busy throughout; at ONSET both print a
    # traceback and say nothing more (an evaluation after a caught exception looks the same)
    builder = SignalsBuilder(hosts=2).gpu(0, 4 * HOUR, 98).logs(0, ONSET - 30, MIN)
    said(builder, ONSET, TRACEBACK, builder.host_names)
    # When decided 2 minutes later (the old rule stopped "fatal last words on every host" a minute after them)
    early = at(builder, ONSET + 2 * MIN)
    # Then alerted with the words, never stoppable; it asks to be decided when the silence turns decisive: busy GPUs
    # without power may be silent `busy_silence_minutes` (30) before anything is owed
    assert (early.diagnosis, early.action, early.stoppable) == (Diagnosis.CRASHED_RANK, Action.ALERT, False)
    assert UNCONFIRMED in early.reasons
    assert any("AssertionError: can only join a child process" in reason for reason in early.reasons)
    # When decided at each time it asks for (first when the GPUs would show a death, then when the silence turns
    # decisive: its last line but the words, + 30 minutes)
    rechecks = [early]
    while not rechecks[-1].stoppable and rechecks[-1].recheck_at is not None:
        rechecks.append(at(builder, rechecks[-1].recheck_at))
    late = rechecks[-1]
    # Then the silence confirms the words then, not before: every host said them, conclusive
    assert (late.diagnosis, late.action, late.stoppable) == (Diagnosis.CRASHED_RANK, Action.WARN, True)
    assert late.at == pytest.approx(ONSET - MIN + 30 * MIN, abs=2)  # its last line (a minute before) + 30
    assert not at(builder, late.at - 5).stoppable
    assert any("its habit owed one" in reason for reason in late.reasons)


def test_watchdog_timeouts_on_every_host_are_confirmed_by_the_line_the_habit_owed() -> None:
    # Given 2 hosts without the agent or power hung at ONSET (GPUs pinned, no line), a line a minute before; ten
    # minutes later every host's NCCL watchdog times out (no evaluation prints that)
    builder = SignalsBuilder(hosts=2).gpu(0, 4 * HOUR, 100).logs(0, ONSET, MIN)
    said(builder, ONSET + 10 * MIN, (WATCHDOG,), builder.host_names)
    # When decided as the lines' wake-up does / Then not yet: a line after them within a period would make them no
    # last words; decisive a minute after them, the job silent past what its habit owed long before
    early = at(builder, ONSET + 10 * MIN + 15)
    assert not early.stoppable
    assert early.recheck_at == pytest.approx(ONSET + 11 * MIN)
    late = at(builder, ONSET + 11 * MIN)
    assert (late.diagnosis, late.action, late.stoppable) == (Diagnosis.HANG, Action.WARN, True)
    assert late.recheck_at == pytest.approx(late.at + 2 * MIN)  # conclusive: the 2-minute grace


def test_fatal_words_on_every_host_whose_gpus_let_go_are_conclusive_a_period_after_them() -> None:
    # Given 2 hosts that print a traceback at ONSET and whose processes let go of their GPUs then
    builder = SignalsBuilder(hosts=2).gpu(0, ONSET, 98).gpu(ONSET, 4 * HOUR, 0).logs(0, ONSET - 30, MIN)
    builder.gpu_memory(0, ONSET, 80).gpu_memory(ONSET, 4 * HOUR, 0)
    said(builder, ONSET + 5, TRACEBACK, builder.host_names)
    # When decided a minute after the words / Then a crashed rank, the GPUs its second witness
    decision = at(builder, ONSET + 5 + 61)
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert any("last words of all 2 hosts, and algo-1 and algo-2's GPUs died" in r for r in decision.reasons)


def test_a_quiet_ranks_words_are_never_confirmed_while_the_job_prints_on() -> None:
    # Given rank 0 alone logs, every minute; algo-2 (which logs only at start-up) prints a traceback at ONSET
    builder = SignalsBuilder(hosts=2).gpu(0, 4 * HOUR, 98).logs(0, 4 * HOUR, MIN, hosts=["algo-1"])
    builder.logs(0, 2 * MIN, 5, hosts=["algo-2"])
    said(builder, ONSET, TRACEBACK, ["algo-2"])
    # When decided an hour later, and 3 hours later (longer than the gap from its start-up lines to its words, which
    # its start-up cadence of 5 s does not make a habit) / Then nothing: it owes no line, and the job printed on
    assert at(builder, ONSET + HOUR).diagnosis is Diagnosis.HEALTHY
    assert at(builder, ONSET + 3 * HOUR).diagnosis is Diagnosis.HEALTHY


def test_a_ranks_own_regular_habit_confirms_its_words_while_the_job_prints_on() -> None:
    # Given rank 0 logs every minute; algo-2 logs every 5 minutes until ONSET, when it prints a traceback
    builder = SignalsBuilder(hosts=2).gpu(0, 5 * HOUR, 98).logs(0, 5 * HOUR, MIN, hosts=["algo-1"])
    builder.logs(0, ONSET - 2 * MIN, 5 * MIN, hosts=["algo-2"])
    said(builder, ONSET, TRACEBACK, ["algo-2"])
    # When decided before and after the line its own habit owes (10 x 5 minutes after its words)
    # Then alerted before it, stopped after it: its own silence is the second witness
    assert not at(builder, ONSET + 45 * MIN).stoppable
    late = at(builder, ONSET + 55 * MIN)
    assert (late.diagnosis, late.stoppable) == (Diagnosis.CRASHED_RANK, True)
    assert any("algo-2: no line for" in reason for reason in late.reasons)


def test_words_whose_gpus_are_neither_busy_nor_idle_ask_for_no_recheck_at_infinity() -> None:
    # Given 2 hosts without the agent or power, a line a minute, GPUs at 50 % (neither busy nor idle: no silence
    # rule holds them); at ONSET both print a traceback and say nothing more
    builder = SignalsBuilder(hosts=2).gpu(0, 4 * HOUR, 50).logs(0, ONSET - 30, MIN)
    said(builder, ONSET, TRACEBACK, builder.host_names)
    # When decided an hour later, with the line its habit owed long gone
    decision = at(builder, ONSET + HOUR)
    # Then its words are alerted, and it asks to be decided again at a time that comes (a schedule can hold it),
    # or at none: never at infinity
    assert decision.action is Action.ALERT
    assert decision.recheck_at is None or decision.recheck_at < ONSET + 2 * HOUR


# --- with the agent --------------------------------------------------------------------------------------------------


def test_a_caught_error_on_every_rank_is_never_stopped_before_the_step_its_step_time_owes() -> None:
    # Given 4 hosts with the agent and 15-minute steps, GPU power at its baseline; every rank prints a traceback 5
    # minutes after the last step, and no step comes
    builder = SignalsBuilder(hosts=4).progress(0, ONSET, step_time=15 * MIN).no_progress(ONSET, 4 * HOUR)
    builder.gpu(0, 4 * HOUR, 100).power(0, 4 * HOUR, 640)
    said(builder, ONSET + 5 * MIN, TRACEBACK, builder.host_names)
    # When decided 10 minutes after the words / Then alerted, not stoppable; its step is owed 2 step intervals on
    early = at(builder, ONSET + 15 * MIN)
    assert (early.diagnosis, early.action, early.stoppable) == (Diagnosis.CRASHED_RANK, Action.ALERT, False)
    assert early.recheck_at == pytest.approx(ONSET + 5 * MIN + 30 * MIN)
    # When that step is owed and absent, but the GPUs still draw their working power / Then still not stoppable:
    # they compute
    assert not at(builder, ONSET + 36 * MIN).stoppable


def test_a_caught_error_and_no_owed_step_with_the_power_fallen_is_stopped_then() -> None:
    # Given the same, but the GPUs' power falls with the words (a collective spinning)
    builder = SignalsBuilder(hosts=4).progress(0, ONSET, step_time=15 * MIN).no_progress(ONSET, 4 * HOUR)
    builder.gpu(0, 4 * HOUR, 100).power(0, ONSET + 5 * MIN, 640).power(ONSET + 5 * MIN, 4 * HOUR, 150)
    said(builder, ONSET + 5 * MIN, TRACEBACK, builder.host_names)
    # When decided when its step is owed (2 intervals after the words) / Then a crashed rank on every host
    decision = at(builder, ONSET + 35 * MIN)
    assert (decision.diagnosis, decision.stoppable) == (Diagnosis.CRASHED_RANK, True)


def _dumps(builder: SignalsBuilder, t: float, frames: tuple | None = None) -> SignalsBuilder:
    lines = stack_dumps(t - MIN, hosts=builder.hosts, ranks_per_host=8, odd=13, seq=88_421)
    if frames is not None:  # every rank elsewhere than in a collective (an evaluation, a data stall)
        lines = tuple(
            (
                at_,
                host,
                StackDump(
                    "job", f"algo-{host + 1}", rank, 32, rank % 8, 4_000 + rank, 7, STALL, 60.0, at_,
                    [{"file": f, "line": n, "func": fn, "code": code, "lib": lib} for f, n, fn, code, lib in frames],
                    [], 1,
                ).line(),
            )
            for rank, (at_, host, _) in enumerate(lines)
        )  # fmt: skip
    for at_, host, line in lines:
        builder.stacks([(at_, line)], builder.host_names[host])
    return builder


def test_the_agents_stall_record_is_alerted_with_its_why_at_once() -> None:
    # Given 4 hosts with the agent, 2-s steps until ONSET; a minute later every rank's stall watch dumped its stacks
    # (31 in all_reduce, rank 13 in its DataLoader)
    builder = SignalsBuilder(hosts=4).progress(0, ONSET, step_time=2).no_progress(ONSET, 4 * HOUR)
    builder.gpu(0, 4 * HOUR, 100).power(0, 4 * HOUR, 640)
    _dumps(builder, ONSET + MIN)
    # When decided as the dumps' wake-up does, 15 s later / Then alerted (a hang, never stoppable) with their why
    decision = at(builder, ONSET + MIN + 15)
    assert (decision.diagnosis, decision.action, decision.stoppable) == (Diagnosis.HANG, Action.ALERT, False)
    assert any("stall watch" in reason for reason in decision.reasons)
    assert any("rank 13 on algo-2" in reason for reason in decision.reasons)


def test_stacks_that_wait_in_no_collective_are_no_early_alert() -> None:
    # Given the same, but every rank waits in its DataLoader (an input stall)
    builder = SignalsBuilder(hosts=4).progress(0, ONSET, step_time=2).no_progress(ONSET, 4 * HOUR)
    builder.gpu(0, 4 * HOUR, 100).power(0, 4 * HOUR, 640)
    _dumps(builder, ONSET + MIN, IN_DATALOADER)
    # When decided / Then nothing yet: the ladder's rungs judge it
    assert at(builder, ONSET + MIN + 15).action is Action.NONE


# --- a crash loop ---------------------------------------------------------------------------------------------------


def test_a_rank_that_dies_on_every_restart_is_stopped_a_period_after_its_third_death() -> None:
    # Given 2 hosts without the agent: at ONSET and every 4 minutes after, algo-2 prints the same CUDA error, the
    # launcher stops every rank (memory let go of) and restarts them (loading, GPUs idle), its lines flowing
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    builder = SignalsBuilder(hosts=2).gpu(0, ONSET, 98).gpu(ONSET, 4 * HOUR, 2).logs(0, ONSET, MIN)
    builder.gpu_memory(0, ONSET, 80)
    crashes = [ONSET + k * 4 * MIN for k in range(3)]
    for k, t in enumerate(crashes):
        builder.gpu_memory(t, t + MIN, 0).gpu_memory(t + MIN, t + 4 * MIN, 40)
        builder.log(t, crash, "algo-2")
        for s in (20, 60, 90):
            for host in builder.host_names:
                builder.log(t + s, f"[rank {k}] Rendezvous complete; restarting from checkpoint", host)
    # When decided at each death's wake-up (its words then the job's last), carrying the state
    state = JobState()
    for t in crashes[:2]:
        state = next_state(state, at(builder, t + 15, state, sawtooth=False))
    early = at(builder, crashes[2] + 15, state, sawtooth=False)
    # Then the third is alerted, and decisive a period after its words: conclusive, the 2-minute grace
    assert early.recheck_at == pytest.approx(crashes[2] + evidence.ALL_FATAL_CONFIRM_S)
    late = at(builder, crashes[2] + evidence.ALL_FATAL_CONFIRM_S, next_state(state, early), sawtooth=False)
    assert (late.diagnosis, late.action, late.stoppable) == (Diagnosis.CRASHED_RANK, Action.WARN, True)
    assert any("a crash loop" in reason for reason in late.reasons)
    assert late.recheck_at == pytest.approx(late.at + 2 * MIN)


def test_a_loops_next_crash_never_sets_its_confirmation_back() -> None:
    # Given a rank dying every 3 minutes, its launcher restarting every rank (memory let go of, then loaded again)
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    builder = SignalsBuilder(hosts=2).gpu(0, ONSET, 98).gpu(ONSET, 4 * HOUR, 2).logs(0, ONSET, MIN)
    builder.gpu_memory(0, ONSET, 80)
    crashes = [ONSET + k * 3 * MIN for k in range(5)]
    for t in crashes:
        builder.gpu_memory(t, t + MIN, 0).gpu_memory(t + MIN, t + 3 * MIN, 40)
        builder.log(t, crash, "algo-2")
    # When read at the fifth death's wake-up (its words 15 s old), the four before it seen by earlier decisions
    now = crashes[4] + 15
    signals = builder.build(now)
    hosts = evidence.read_hosts(signals, ONSET, ENFORCE.thresholds, Limits.of(ENFORCE.thresholds, 1.0, None), now)
    loop = evidence.crash_loop(signals, hosts, crashes[:4], ENFORCE.thresholds, now)
    # Then the loop is confirmed already: a period after its third death, not after its newest
    assert loop is not None
    assert "5 times" in loop.reasons[0]
    assert loop.onset + loop.confirm_s == pytest.approx(crashes[2] + evidence.ALL_FATAL_CONFIRM_S)
