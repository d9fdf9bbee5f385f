"""The corpus of real log lines (corpus/real_lines/): what the patterns recognise, what the server-side filter keeps
as CloudWatch Logs applies it, which lookalikes they leave alone, and how checkpoint markers are read. The figures are
issue 29's; every miss is printed (pytest -s, or in the failure)."""

from __future__ import annotations

from collections import Counter

import pytest

from corpus import real_lines
from localrun import moto_logs_filter
from stallwatch.core import evidence, log_patterns

FATAL = real_lines.lines(label="fatal")
BENIGN = real_lines.lines(label="benign")
MARKERS = real_lines.lines(label="checkpoint_start") + real_lines.lines(label="checkpoint_end")
# Issue 29's kinds: every one holds real lines
FATAL_KINDS = {
    "nccl",
    "nccl_timeout",
    "c10d_timeout",
    "efa",
    "sagemaker_toolkit",
    "segfault",
    "sigabrt",
    "xid_fatal",
    "oom_kill",
    "cuda_oom",
    "cuda_error",
    "launcher_exit",
    "deepspeed_launcher",
    "mpirun",
    "slurm",
    "killed",
    "traceback",
}
BENIGN_KINDS = {"grad_overflow", "nccl_info", "tqdm", "xid_info", "warning", "training_progress"}
CHECKPOINT_FRAMEWORKS = {
    "transformers",
    "deepspeed",
    "megatron-deepspeed",
    "lightning",
    "nemo",
    "torchtitan",
    "metaseq",
}


def _report(title: str, misses: list[real_lines.RealLine], total: int) -> str:
    lines = [f"{title}: {len(misses)} of {total}"] + [f"  [{r.kind}] {r.text[:150]!r}  ({r.source})" for r in misses]
    text = "\n".join(lines)
    print(text)
    return text


def test_the_corpus_is_real_lines_with_their_sources_and_labels() -> None:
    everything = real_lines.lines()
    assert len(everything) >= 300
    assert all(r.source.startswith("https://github.com/") for r in everything)
    assert {r.label for r in everything} == set(real_lines.LABELS)
    assert all(r.incident for r in FATAL)
    assert not any(r.incident for r in BENIGN + MARKERS)
    assert {r.kind for r in FATAL} >= FATAL_KINDS
    assert {r.kind for r in BENIGN} >= BENIGN_KINDS
    assert {r.framework for r in MARKERS} >= CHECKPOINT_FRAMEWORKS


def test_fatal_lines_are_recognised_and_every_incident_has_one() -> None:
    misses = [r for r in FATAL if not log_patterns.match(r.text)]
    report = _report("fatal lines not recognised", misses, len(FATAL))
    assert len(misses) <= 0.03 * len(FATAL), report
    recognised = Counter(r.incident for r in FATAL if log_patterns.match(r.text))
    assert not {r.incident for r in FATAL} - set(recognised), "incidents with no recognised line"


def test_the_server_side_filter_keeps_the_fatal_lines_as_cloudwatch_applies_it() -> None:
    # The subscription filter's pattern and FilterLogEvents' fatal one, applied by CloudWatch's rules (the moto fixture)
    misses = [r for r in FATAL if not moto_logs_filter.keeps(log_patterns.FATAL_FILTER_PATTERN, r.text)]
    report = _report("fatal lines the filter drops", misses, len(FATAL))
    assert len(misses) <= 0.03 * len(FATAL), report


def test_benign_lookalikes_are_not_called_fatal_nor_checkpoints() -> None:
    fatal = [r for r in BENIGN if log_patterns.match(r.text)]
    report = _report("benign lines called fatal", fatal, len(BENIGN))
    assert len(fatal) <= 0.02 * len(BENIGN), report
    markers = [r for r in BENIGN if log_patterns.marker(r.text)]
    assert len(markers) <= 0.02 * len(BENIGN), _report("benign lines read as checkpoint markers", markers, len(BENIGN))


def test_checkpoint_markers_are_read_right() -> None:
    wrong = [r for r in MARKERS if log_patterns.classify(r.text) != (None, r.label)]
    report = _report("checkpoint markers misread", wrong, len(MARKERS))
    assert len(wrong) <= 0.05 * len(MARKERS), report
    # and the checkpoint filter keeps every one of them
    assert all(moto_logs_filter.keeps(log_patterns.CHECKPOINT_FILTER_PATTERN, r.text) for r in MARKERS)


@pytest.mark.parametrize("seq", real_lines.sequences(kind="crash"), ids=lambda s: s.name)
def test_every_crash_sequence_ends_in_recognised_last_words(seq: real_lines.Sequence) -> None:
    # a fatal line within the last words' burst (evidence.FATAL_BURST_S before the last line)
    burst = [line for line in seq.lines if line.t >= seq.lines[-1].t - evidence.FATAL_BURST_S]
    assert any(log_patterns.match(line.text) for line in burst)
    assert all(b.t >= a.t for a, b in zip(seq.lines, seq.lines[1:], strict=False))


@pytest.mark.parametrize("seq", real_lines.sequences(kind="checkpoint"), ids=lambda s: s.name)
def test_every_checkpoint_sequence_has_a_start_and_a_long_write_to_stretch(seq: real_lines.Sequence) -> None:
    assert any(log_patterns.marker(line.text) == log_patterns.CHECKPOINT_START for line in seq.lines)
    assert seq.write_after is not None
    long = seq.stretched(30 * 60)
    assert long.lines[seq.write_after + 1].t - long.lines[seq.write_after].t == pytest.approx(30 * 60)
    assert [line.text for line in long.lines] == [line.text for line in seq.lines]
