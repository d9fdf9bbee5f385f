"""The detection-latency table of docs/backtest.md, from `stallwatch replay --json` output on stdin.

    stallwatch replay corpus/traces/*.jsonl --json | python corpus/latency.py

For a trace labeled "stop", latency counts from the start of its window (the corpus puts the stall's onset
there) to the first warning and to the stop. Below the table: the median onset-to-stop over those traces, and
the false warnings (stop warnings sent to traces labeled "none").
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _minutes(at: float | None, onset: float | None) -> str:
    return "-" if at is None or onset is None else f"{(at - onset) / 60:.1f}"


def main() -> int:
    print(
        "| trace | label | diagnoses seen | onset (s) | onset → warn (min) | onset → stop (min) | alerts | warnings "
        "| verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    stops, false_warnings = [], 0
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
            str(result["alerts"]),
            str(result["warnings"]),
            str(result["verdict"]),
        ]
        print("| " + " | ".join(row) + " |")
        if onset is not None and result["first_stop_s"] is not None:
            stops.append((result["first_stop_s"] - onset) / 60)
        if expect.get("action") == "none":
            false_warnings += result["warnings"]
    median = f"{statistics.median(stops):.1f} min" if stops else "-"
    print(
        f"\nMedian onset → stop over {len(stops)} stalls: {median}. False warnings on healthy traces: {false_warnings}."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
