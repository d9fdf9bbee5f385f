"""Why it hung: the agent's stack dumps read, grouped, and the odd rank out named; in the decision and its alert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallwatch.core import log_patterns, stack_dumps
from stallwatch.core.decision import Diagnosis
from stallwatch.core.signals import LogLine, Series
from tests.core.signals_builder import SignalsBuilder
from tests.core.test_engine import ENFORCE, HOUR, MIN, ONSET, diagnose, hung, idle_without_agent

# Real lines: tests/agent/test_distributed.py's stalls under torchrun (2 ranks, gloo), as the ranks' stdout wrote them.
DUMPS = Path(__file__).with_name("stack_dumps")
LOADER = (DUMPS / "loader-stall.log").read_text().splitlines()  # rank 1 in its loader's sleep, the recorder on
CHECKPOINT = (DUMPS / "checkpoint-stall.log").read_text().splitlines()  # rank 0 writing alone, no recorder


def lines(messages: list[str], t: float = 100.0, stream: str = "job/algo-1-1700000000") -> list[LogLine]:
    return [LogLine.read(t + i, stream, message) for i, message in enumerate(messages)]


def dump_line(rank: int, frames: list[tuple[str, int, str, bool]], world: int, seq: int | None = None, **extra) -> str:
    """A line in the agent's format: frames (file, line, function, library) innermost first."""
    main = [{"file": f, "line": n, "func": fn} | ({"lib": True} if lib else {}) for f, n, fn, lib in frames]
    collective = None if seq is None else {"group": "default_pg", "seq": seq, "op": "all_reduce", "state": "scheduled"}
    record = {"StallwatchStacks": 1, "JobName": "llm", "Host": f"algo-{rank // 8 + 1}", "Rank": rank}
    record |= {"WorldSize": world, "Reason": "stall", "Main": main, "Collective": collective} | extra
    return json.dumps(record, separators=(",", ":"))


IN_ALL_REDUCE = [
    ("torch/distributed/distributed_c10d.py", 2501, "all_reduce", True),
    ("torch/distributed/c10d_logger.py", 83, "wrapper", True),
    ("train.py", 212, "train_step", False),
]
IN_LOADER = [("loader.py", 88, "__next__", False), ("train.py", 198, "train", False)]


def test_the_loader_stall_names_rank_1_behind_in_the_sequence_and_its_file_and_line() -> None:
    report = stack_dumps.explain(stack_dumps.latest(lines(LOADER)))
    assert (report.rule, report.named) == (stack_dumps.SEQUENCE, [1])
    assert report.summary == (
        "1 rank in all_reduce (distributed_worker.py:158, seq 4); rank 1 on vm in distributed_worker.py:135 "
        "`time.sleep(BLOCK_S)  # the stuck read`, seq 3"
    )


def test_the_checkpoint_stall_names_rank_0_outside_the_collective_the_other_waits_in() -> None:
    report = stack_dumps.explain(stack_dumps.latest(lines(CHECKPOINT)))
    assert (report.rule, report.named) == (stack_dumps.COLLECTIVE, [0])
    assert report.summary.startswith("1 rank in all_reduce (distributed_worker.py:158); rank 0 on vm in ")
    assert 'distributed_worker.py:142 `with path.open("wb") as checkpoint:' in report.summary


def test_63_ranks_in_all_reduce_and_one_in_its_loader_name_the_one_with_its_host() -> None:
    # Given 64 ranks on 8 hosts, the flight recorder on: 63 wait in all_reduce seq 88421, rank 17 is at 88420
    messages = [dump_line(r, IN_ALL_REDUCE, 64, 88421) for r in range(64) if r != 17]
    messages.append(dump_line(17, IN_LOADER, 64, 88420))

    report = stack_dumps.explain(stack_dumps.latest(lines(messages)))

    assert report.named == [17]
    assert report.summary == (
        "63 ranks in all_reduce (train.py:212, seq 88421); rank 17 on algo-3 in loader.py:88, seq 88420"
    )
    evidence = report.evidence()
    assert evidence["named"] == [17]
    odd, majority = evidence["groups"]
    assert (odd["odd"], odd["count"], odd["hosts"], odd["frames"][0]) == (True, 1, ["algo-3"], "loader.py:88 __next__")
    assert (majority["count"], len(majority["ranks"])) == (63, stack_dumps.RANKS_NAMED)
    assert len(json.dumps(evidence)) < 4_000


def test_without_the_recorder_ranks_outside_any_collective_are_named_and_a_minority_otherwise() -> None:
    waiting = [dump_line(r, IN_ALL_REDUCE, 8) for r in range(7)]
    assert stack_dumps.explain(stack_dumps.latest(lines([*waiting, dump_line(7, IN_LOADER, 8)]))).named == [7]
    # every rank outside a collective: the smaller group is named
    eval_loop = [("eval.py", 40, "evaluate", False)]
    elsewhere = [dump_line(r, IN_LOADER, 8) for r in range(6)] + [dump_line(r, eval_loop, 8) for r in (6, 7)]
    report = stack_dumps.explain(stack_dumps.latest(lines(elsewhere)))
    assert (report.rule, report.named) == (stack_dumps.MINORITY, [6, 7])


def test_a_tie_names_nobody_and_says_where_each_group_is() -> None:
    report = stack_dumps.explain(
        stack_dumps.latest(lines([dump_line(0, IN_LOADER, 2), dump_line(1, [("eval.py", 1, "f", False)], 2)]))
    )
    assert report.rule is None
    assert report.named == []
    assert report.summary.startswith("no odd rank out: 1 rank in __next__ (loader.py:88); 1 rank in f (eval.py:1)")


def test_when_every_rank_waits_the_ranks_without_a_dump_are_named() -> None:
    # Given 15 of 16 ranks waiting in all_reduce and rank 9 silent (a dead process writes no dump)
    report = stack_dumps.explain(
        stack_dumps.latest(lines([dump_line(r, IN_ALL_REDUCE, 16) for r in range(16) if r != 9]))
    )
    assert (report.rule, report.named, report.missing) == (stack_dumps.MISSING, [9], (9,))
    assert report.summary.endswith("; no dump from rank 9")


def test_a_read_that_holds_few_ranks_names_no_missing_rank() -> None:
    # Given 40 of a 4,096-rank job's dumps (a read cut short), all in one place
    report = stack_dumps.explain(stack_dumps.latest(lines([dump_line(r, IN_ALL_REDUCE, 4096) for r in range(40)])))
    assert report.named == []
    assert "of 4096 ranks" in report.summary


def test_each_ranks_newest_dump_since_the_stall_began_counts_and_launcher_prefixes_are_read() -> None:
    # Given an earlier stall's dump of rank 0 (t=50), this stall's (t=200, behind torchrun's and srun's prefixes)
    old = LogLine.read(50.0, "s", dump_line(0, IN_LOADER, 2))
    new = [
        LogLine.read(200.0, "s", "[default0]:" + dump_line(0, IN_ALL_REDUCE, 2)),
        LogLine.read(201.0, "s", "1: " + dump_line(1, IN_LOADER, 2)),
    ]
    found = stack_dumps.latest([old, *new], since=150.0)
    assert [(d.rank, d.t) for d in found] == [(0, 200.0), (1, 201.0)]


@pytest.mark.parametrize(
    "message",
    [
        '{"StallwatchStacks":1,"Rank":0,"Main":[{"file":"a.py"',  # cut by a 256 KB split or a crash mid-write
        '{"StallwatchStacks":1,"Rank":"zero","Main":[]}',
        '{"StallwatchStacks":1,"Rank":-1,"Main":[]}',
        '{"StallwatchStacks":1,"Rank":0,"Main":[{"file":"a.py"}]}',
        '{"StallwatchStacks":1,"Rank":0,"Main":"frames"}',
        "grep StallwatchStacks train.log",
        "",
    ],
)
def test_a_line_that_is_not_a_well_formed_dump_is_ignored(message: str) -> None:
    assert stack_dumps.latest([LogLine.read(1.0, "s", message)]) == []


@pytest.mark.parametrize(
    "message",
    [
        '{"StallwatchStacks":1,"Rank":0,"Main":[{"file":"a.py","line":Infinity,"func":"f"}]}',  # int(inf) raised
        '{"StallwatchStacks":1,"Rank":0,"Main":[{"file":"a.py","line":1e400,"func":"f"}]}',
        '{"StallwatchStacks":1,"Rank":0,"Main":[{"file":"a.py","line":"88","func":"f"}]}',
        '{"StallwatchStacks":1,"Rank":0,"Main":[{"file":"a.py","line":1,"func":"f"}],"Rank":-5}',
        '{"StallwatchStacks":1,"Rank":1048576,"WorldSize":1048577,"Main":[]}',  # no job's rank
        '{"StallwatchStacks":1,"Rank":0,"Main":' + "[" * 5_000 + "]" * 5_000 + "}",  # RecursionError in json
    ],
    ids=["line-inf", "line-1e400", "line-text", "rank-negative", "rank-past-bound", "deep"],
)
def test_a_line_whose_fields_no_dump_has_is_ignored_not_raised(message: str) -> None:
    assert stack_dumps.latest([LogLine.read(1.0, "s", message)]) == []


def test_a_world_size_past_the_bound_is_read_as_unknown_without_building_the_world() -> None:
    # Given two ranks' dumps claiming a world of 10**12 ranks (set(range(10**12)) was a MemoryError)
    messages = [dump_line(r, IN_ALL_REDUCE, 10**12, 7) for r in range(2)]

    # When they are read and explained
    report = stack_dumps.explain(stack_dumps.latest(lines(messages)))

    # Then the world is the ranks seen, each dump cut short, and the summary says so
    assert (report.ranks, report.missing_count, report.cut) == (2, 0, 2)
    assert report.summary.endswith("; 2 of the dumps cut short")


def test_a_large_world_with_few_dumps_names_a_few_missing_and_counts_the_rest() -> None:
    # Given 3 dumps of a world of 1,048,576 ranks (the bound itself)
    messages = [dump_line(r, IN_ALL_REDUCE, stack_dumps.WORLD_SIZE_MAX, 7) for r in (0, 2, 5)]

    report = stack_dumps.explain(stack_dumps.latest(lines(messages)))

    assert report.missing == (1, 3, 4, 6, 7, 8, 9, 10)
    assert report.missing_count == stack_dumps.WORLD_SIZE_MAX - 3
    assert report.summary.endswith("(3 of 1048576 ranks' dumps read)")
    assert report.evidence()["missing_count"] == stack_dumps.WORLD_SIZE_MAX - 3


@pytest.mark.parametrize("field", ["Host", "file", "func", "code", "Reason", "group", "frames", "line"])
def test_a_dump_over_a_bound_is_read_cut_short_and_its_evidence_stays_a_few_kb(field: str) -> None:
    # Given a rank whose dump is over one bound: a 230 KB text, 10,000 frames, or a line of 1 MB
    big = "<" + "x" * 230_000
    frame = {"file": "train.py", "line": 212, "func": "step", "code": "loss.backward()"}
    frame |= {field: big} if field in ("file", "func", "code") else {}
    record = {"StallwatchStacks": 1, "Host": "algo-1", "Rank": 1, "WorldSize": 2, "Reason": "stall"}
    record |= {field: big} if field in ("Host", "Reason") else {}
    record["Collective"] = {"group": big if field == "group" else "default_pg", "seq": 3, "op": "all_reduce"}
    record["Main"] = [frame] * (10_000 if field == "frames" else 1)
    message = json.dumps(record) + (" " * 1_000_000 if field == "line" else "")
    healthy = dump_line(0, IN_ALL_REDUCE, 2, 4)

    # When the stall's dumps are explained
    report = stack_dumps.explain(stack_dumps.latest(lines([healthy, message])))

    # Then what the decision keeps is a few KB; the rank is read and named, its dump cut short (a host past the
    # line's bound cuts it before its rank: it is read as no dump), its texts and frames within their bounds
    assert len(report.summary) < 1_000
    assert len(json.dumps(report.evidence())) < 6_000
    if field == "Host":
        assert (report.ranks, report.named) == (1, [1])  # the rank that wrote no dump
        return
    assert (report.named, report.cut) == ([1], 0 if field == "line" else 1)
    (dump,) = stack_dumps.latest(lines([message]))
    texts = [dump.host, dump.reason, *(t for f in dump.main for t in (f.file, f.func, f.code or ""))]
    assert max(len(t) for t in texts) <= stack_dumps.TEXT_CHARS
    assert len(dump.main) <= stack_dumps.FRAMES_READ


def test_a_line_past_its_length_is_read_as_far_as_its_bound_as_a_dump_cut_short() -> None:
    # Given a dump whose frames run past LINE_CHARS (the agent never writes one: a forged or corrupted line)
    frames = [{"file": f"mod{i}.py", "line": i, "func": "f" * 150} for i in range(200)]
    record = {"StallwatchStacks": 1, "Host": "algo-2", "Rank": 9, "WorldSize": 16, "Main": frames}
    message = "[default9]:" + json.dumps(record)
    assert len(message) > stack_dumps.LINE_CHARS

    (dump,) = stack_dumps.latest(lines([message]))

    assert (dump.rank, dump.host, dump.world_size, dump.cut) == (9, "algo-2", 16, True)
    assert dump.main[0].place == "mod0.py:0"
    assert len(dump.main) == stack_dumps.FRAMES_READ


def test_a_dump_is_the_agents_own_line_never_a_fatal_line_or_a_checkpoint_marker() -> None:
    # A frame of a checkpoint writer, a thread named after a kill: the words the notable filter looks for
    message = dump_line(0, [("ckpt.py", 9, "saving_checkpoint", False)], 1, Threads=[{"name": "Killed", "at": "x"}])
    line = LogLine.read(1.0, "s", message)
    assert (line.pattern, line.marker) == (None, None)
    assert log_patterns.agent_window(message)


def test_the_read_starts_at_the_last_window_with_a_step_and_not_at_all_while_stepping() -> None:
    stepping = {"Steps": Series(((60.0, 30.0), (120.0, 28.0)))}
    stalled = {"Steps": Series(((60.0, 30.0), (120.0, 2.0), (180.0, 0.0), (240.0, 0.0)))}
    never = {"Steps": Series(((60.0, 0.0),))}
    assert stack_dumps.dumps_since(stepping, 0.0) is None
    assert stack_dumps.dumps_since(stalled, 0.0) == 120.0
    assert stack_dumps.dumps_since(never, -5.0) == -5.0
    assert stack_dumps.dumps_since({}, 0.0) is None  # no agent: no dump to read
    assert len(stack_dumps.FILTER_PATTERN) <= 1024


# --- in the decision ----------------------------------------------------------------------------------------------


def stalled_with(messages: list[str], builder: SignalsBuilder | None = None) -> SignalsBuilder:
    """A hung 8-host job whose ranks dumped a minute into the stall."""
    return (builder or hung(hosts=8)).stacks((ONSET + MIN + i * 0.1, m) for i, m in enumerate(messages))


def test_a_hang_decision_names_the_odd_rank_in_its_reasons_and_keeps_the_groups_in_its_evidence() -> None:
    messages = [dump_line(r, IN_ALL_REDUCE, 64, 88421) for r in range(64) if r != 17]
    decision = diagnose(stalled_with([*messages, dump_line(17, IN_LOADER, 64, 88420)]), ONSET + 16 * MIN)
    assert decision.diagnosis is Diagnosis.HANG
    assert any(reason.endswith("; rank 17 on algo-3 in loader.py:88, seq 88420") for reason in decision.reasons)
    assert decision.evidence["stacks"]["named"] == [17]


def test_dumps_of_an_earlier_stall_are_not_this_ones() -> None:
    # Given rank 5's dump written during a pause an hour before the steps stopped
    builder = hung(hosts=1).stacks([(ONSET - HOUR, dump_line(5, IN_LOADER, 8))])
    decision = diagnose(builder, ONSET + 16 * MIN)
    assert stack_dumps.NO_DUMPS in decision.reasons


def test_without_the_agent_the_alert_says_in_one_line_that_there_is_no_dump() -> None:
    decision = diagnose(idle_without_agent(), ONSET + 40 * MIN, ENFORCE)
    assert decision.stalled
    assert [r for r in decision.reasons if "stack" in r] == [stack_dumps.NO_AGENT]
    assert decision.evidence["stacks"]["groups"] == []


def test_a_healthy_decision_carries_no_stacks() -> None:
    decision = diagnose(hung(), ONSET - 10 * MIN)
    assert "stacks" not in decision.evidence
