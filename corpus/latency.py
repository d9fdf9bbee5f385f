"""The detection-latency table of docs/backtest.md, from `stallwatch replay --json` output on stdin.

    stallwatch replay corpus/traces/*.jsonl --json | python corpus/latency.py

For a trace labeled "stop", latency counts from the start of its window (the corpus puts the stall's onset
there) to the first warning and to the stop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _minutes(at: float | None, onset: float | None) -> str:
    return "-" if at is None or onset is None else f"{(at - onset) / 60:.1f}"


def main() -> int:
    print("| trace | label | diagnoses seen | onset (s) | onset → warn (min) | onset → stop (min) | verdict |")
    print("|---|---|---|---|---|---|---|")
    for line in sys.stdin:
        result = json.loads(line)
        expect = result.get("expect") or {}
        onset = (expect.get("window_s") or [None])[0]
        row = [
            Path(result["trace"]).stem,
            expect.get("action", "unlabeled"),
            ", ".join(result["diagnoses"]),
            "-" if onset is None else f"{onset:g}",
            _minutes(result["first_warn_s"], onset),
            _minutes(result["first_stop_s"], onset),
            str(result["verdict"]),
        ]
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
