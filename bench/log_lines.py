"""How the log rules read real lines: the corpus part they were written from beside the parts they were not, and what a
line costs to read, this tree's rules beside a baseline revision's.

    .venv/bin/python bench/log_lines.py                      # every column, by family, and the cost per line vs main
    .venv/bin/python bench/log_lines.py --baseline aa3383f   # the cost against another revision's rules
    .venv/bin/python bench/log_lines.py --misses written     # print the lines each figure misses, in one column
    .venv/bin/python bench/log_lines.py --rules main         # the figures of an earlier revision's rules, same lines

Columns (corpus/real_lines/README.md, "Two parts"): `written`, the part the rules were written from; `measured part`,
every line they were not written from (the issue's goals are read on it), then that part by its rounds: `measured`, the
sources of round 39/1 its seeded hash put there; the `fresh 39/N` columns (rounds 3, 5, 7, 9, 15, 22, 24, 26, 28, 30 and
32), the measured lines quoted after the rules were frozen or sealed while they were written (round 39/3 before the
structural rules, round 39/5 after them, round 39/7 after the breadth round's structure readers, round 39/9 beside round
39/8's rules, round 39/15 after the source rounds and rounds 39/13 and 39/14, round 39/22 after the source rounds 39/16
to 39/21, round 39/24 beside round 39/23's rules, round 39/26 beside the source round 39/25's, round 39/28 beside the
source round 39/27's, round 39/30 beside the source round 39/29's, round 39/32 beside the source round 39/31's).
Figures per column: fatal lines recognised (`log_patterns.match` names a kind), kept by the subscription filter as
CloudWatch Logs applies it (`localrun.moto_logs_filter`), benign lines called fatal, and checkpoint markers read right
(`classify` gives the label's marker and no fatal kind). The cost is the median of 7 runs, in microseconds a line, for
ordinary lines holding no phrase of `log_patterns.COVER`, ordinary lines holding one (in the baseline's cover), and the
whole corpus; both rule sets are timed in this process, their runs interleaved, so the machine's load weighs on both
alike. Print --misses only for the written part when changing rules: the measured columns' misses are reported, never
written from.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]

from corpus import real_lines  # noqa: E402
from localrun import moto_logs_filter  # noqa: E402
from stallwatch import core  # noqa: E402
from stallwatch.core import log_patterns  # noqa: E402

RULES_DIR = "lambdas/stallwatch/core"  # log_patterns.py and the log_structure.py it reads
# The corpus's kinds of fatal line, by the family a reader would file them under.
FAMILIES = {
    "nccl": "NCCL",
    "nccl_timeout": "NCCL",
    "c10d_timeout": "c10d store",
    "efa": "EFA / libfabric",
    "cuda_error": "CUDA",
    "cuda_oom": "CUDA",
    "xid_fatal": "Xid / NVRM",
    "gpu_driver": "Xid / NVRM",
    "gloo": "gloo / RCCL",
    "rccl": "gloo / RCCL",
    "storage": "storage",
    "container": "container runtimes",
    "kubernetes": "Kubernetes",
    "systemd": "init / systemd",
    "oom_kill": "host OOM killer",
    "segfault": "signals",
    "sigabrt": "signals",
    "killed": "signals",
    "sigfpe": "signals",
    "launcher_exit": "torchrun / launchers",
    "deepspeed_launcher": "torchrun / launchers",
    "mpirun": "MPI",
    "slurm": "Slurm",
    "lsf": "LSF",
    "sagemaker_toolkit": "SageMaker",
    "neuron": "Neuron (NRT, NMGR, CCOM)",
    "xla": "JAX / XLA",
    "ray": "Ray",
    "traceback": "Python",
    "python_exception": "Python",
    "app_fatal": "application",
}
# Ordinary lines of training logs (their steps, losses and bars), the bulk of what the engine reads.
ORDINARY = (
    "step 120 loss 2.31 lr 3e-4 grad_norm 0.93 tokens/s 51234",
    " 45%|████▌     | 450/1000 [10:23<12:41,  1.39s/it]",
    "{'loss': 2.0491, 'learning_rate': 0.0001961913563176343, 'epoch': 0.28}",
    " iteration    33240/  311541 | consumed samples:     15019344 | elapsed time per iteration (ms): 23491.4",
)
ORDINARY_WITH_A_PHRASE = (
    "[rank0]:[titan] 2025-06-25 13:20:46,458 - root - INFO - step: 800  loss:  4.7215  memory: 49.66GiB(52.28%)",
    "step 800 | loss 4.7215 | grad norm 0.59 | model tflops 338.65 | mfu 34.24%",
)


# The fresh batches: measured lines quoted after the rules were frozen (real_lines.ROUNDS), each in its own column.
FRESH = {
    "fresh 39/3": (39, 3),
    "fresh 39/5": (39, 5),
    "fresh 39/7": (39, 7),
    "fresh 39/9": (39, 9),
    "fresh 39/15": (39, 15),
    "fresh 39/22": (39, 22),
    "fresh 39/24": (39, 24),
    "fresh 39/26": (39, 26),
    "fresh 39/28": (39, 28),
    "fresh 39/30": (39, 30),
    "fresh 39/32": (39, 32),
}
COLUMNS: dict[str, Callable[[real_lines.RealLine], bool]] = {
    "written": lambda r: r.part == real_lines.WRITTEN,
    "measured part": lambda r: r.part == real_lines.MEASURED,
    "measured": lambda r: r.part == real_lines.MEASURED and (r.added, r.round) not in FRESH.values(),
    **{
        column: (lambda r, batch=batch: r.part == real_lines.MEASURED and (r.added, r.round) == batch)
        for column, batch in FRESH.items()
    },
}
# Issue 39's goals for the lines the rules were not written from.
GOALS = {
    "fatal lines recognised": ">= 90 %",
    "fatal lines kept by the filter": ">= 95 %",
    "benign lines called fatal": "<= 2 %",
    "checkpoint markers read right": ">= 90 %",
    "Neuron (NRT, NMGR, CCOM) recognised": ">= 6 of 7 (86 %)",
}
NEURON = "Neuron (NRT, NMGR, CCOM)"


def rows(column: str, *labels: str) -> list[real_lines.RealLine]:
    """The lines of a column with one of these labels."""
    keep = COLUMNS[column]
    return [r for label in labels for r in real_lines.lines(label=label) if keep(r)]


def percent(hits: int, total: int) -> str:
    return f"{hits}/{total} ({100 * hits / total:.0f} %)" if total else "-"


def figures(column: str, misses: bool) -> dict[str, str]:
    fatal = rows(column, "fatal")
    benign = rows(column, "benign")
    marks = rows(column, "checkpoint_start", "checkpoint_end")
    missed = [r for r in fatal if not log_patterns.match(r.text)]
    dropped = [r for r in fatal if not moto_logs_filter.keeps(log_patterns.FATAL_FILTER_PATTERN, r.text)]
    false = [r for r in benign if log_patterns.match(r.text)]
    misread = [r for r in marks if log_patterns.classify(r.text) != (None, r.label)]
    if misses:
        for title, missing in [("fatal not recognised", missed), ("dropped by the filter", dropped),
                               ("benign called fatal", false), ("markers misread", misread)]:  # fmt: skip
            print(f"\n{column}: {title}")
            for r in missing:
                print(f"  [{r.kind}] {r.text[:160]!r}  ({r.source})")
    neuron = [r for r in fatal if FAMILIES.get(r.kind) == NEURON]
    return {
        "fatal lines recognised": percent(len(fatal) - len(missed), len(fatal)),
        "fatal lines kept by the filter": percent(len(fatal) - len(dropped), len(fatal)),
        "benign lines called fatal": percent(len(false), len(benign)),
        "checkpoint markers read right": percent(len(marks) - len(misread), len(marks)),
        f"{NEURON} recognised": percent(sum(log_patterns.match(r.text) is not None for r in neuron), len(neuron)),
    }


def by_family(column: str) -> dict[str, str]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows(column, "fatal"):
        tally = counts[FAMILIES.get(r.kind, r.kind)]
        tally[0] += log_patterns.match(r.text) is not None
        tally[1] += 1
    return {family: f"{hit}/{total}" for family, (hit, total) in counts.items()}


def markers_by_framework(column: str) -> dict[str, str]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows(column, "checkpoint_start", "checkpoint_end"):
        tally = counts[r.framework]
        tally[0] += log_patterns.classify(r.text) == (None, r.label)
        tally[1] += 1
    return {framework: f"{hit}/{total}" for framework, (hit, total) in counts.items()}


def table(title: str, rows: dict[str, dict[str, str]]) -> None:
    parts = list(rows)
    keys = sorted({key for values in rows.values() for key in values})
    print(f"\n| {title} | " + " | ".join(parts) + " |")
    print("|---" * (len(parts) + 1) + "|")
    for key in keys:
        print(f"| {key} | " + " | ".join(rows[part].get(key, "-") for part in parts) + " |")


def baseline_rules(rev: str) -> ModuleType:
    """The rules as revision `rev` had them, loaded beside this tree's: its `log_patterns` reading its own
    `log_structure` (where it had one), never this tree's."""
    structure = _module_at(rev, "log_structure", required=False)
    held = core.log_structure
    core.log_structure = structure or held  # what `from stallwatch.core import log_structure` binds while it loads
    try:
        rules = _module_at(rev, "log_patterns", required=True)
    finally:
        core.log_structure = held
    assert rules is not None
    return rules


def _module_at(rev: str, name: str, required: bool) -> ModuleType | None:
    path = f"{RULES_DIR}/{name}.py"
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=required)
    if shown.returncode:
        return None
    spec = importlib.util.spec_from_loader(f"{name}_{rev}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    exec(compile(shown.stdout, f"{rev}:{path}", "exec"), module.__dict__)
    return module


def microseconds(rules: tuple[ModuleType, ...], lines: tuple[str, ...], repeat: int = 7) -> list[float]:
    """The median cost of a line for each rule set, their runs interleaved so the machine's load weighs on all alike."""
    rounds = max(20_000 // len(lines), 1)
    runs: list[list[float]] = [[] for _ in rules]
    for _ in range(repeat):
        for module, timings in zip(rules, runs, strict=True):
            start = time.perf_counter()
            for _ in range(rounds):
                for line in lines:
                    module.classify(line)
            timings.append((time.perf_counter() - start) / (rounds * len(lines)) * 1e6)
    return [statistics.median(timings) for timings in runs]


def cost(rev: str) -> None:
    old = baseline_rules(rev)
    corpus = tuple(r.text for r in real_lines.lines())
    print(f"\n| cost a line (µs, median of 7) | {rev} | this tree |\n|---|---|---|")
    for title, lines in [("ordinary, no phrase of COVER", ORDINARY), ("ordinary, a phrase of COVER",
                         ORDINARY_WITH_A_PHRASE), ("the whole corpus", corpus)]:  # fmt: skip
        before, after = microseconds((old, log_patterns), lines)
        print(f"| {title} | {before:.2f} | {after:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="main", help="the revision whose rules the cost is compared with")
    parser.add_argument("--misses", choices=COLUMNS, help="print the lines each figure misses in this column")
    parser.add_argument("--rules", help="read the lines with this revision's rules instead of this tree's")
    args = parser.parse_args()
    if args.rules:
        global log_patterns
        log_patterns = baseline_rules(args.rules)  # type: ignore[assignment]
    table("figure", {column: figures(column, args.misses == column) for column in COLUMNS} | {"goal": GOALS})
    table("fatal lines recognised, by family", {column: by_family(column) for column in COLUMNS})
    table("checkpoint markers read right, by framework", {column: markers_by_framework(column) for column in COLUMNS})
    assert all(not line or not log_patterns.match(line) for line in ORDINARY + ORDINARY_WITH_A_PHRASE)
    if not args.rules:
        cost(args.baseline)


if __name__ == "__main__":
    main()
