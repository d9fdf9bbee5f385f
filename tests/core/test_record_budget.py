"""What the table keeps of a decision fits its item (`core.record_budget`): a record over its budget is cut, by
steps, until it fits, and says so."""

from __future__ import annotations

import pytest

from stallwatch.core import record_budget

BUDGET = 200_000


def audit(**evidence: object) -> dict[str, object]:
    return {
        "at": 1.5,
        "job": "llama",
        "diagnosis": "hang",
        "action": "warn",
        "reasons": ["no step"],
        "evidence": evidence,
    }


def test_a_record_within_its_budget_is_kept_as_it_is() -> None:
    record = audit(stacks={"summary": "63 ranks in all_reduce"})
    assert record_budget.fit(record, BUDGET) is record


@pytest.mark.parametrize(
    "evidence",
    [
        {"line": "x" * 500_000},  # one long text
        {"hosts": {f"i-{n:017x}": {"gpu_util": [1.0] * 50} for n in range(5_000)}},  # many hosts
        {"frames": [["f" * 1_000] * 1_000] * 10},  # long lists of long texts
        {"deep": [[[["<!channel> & more" * 100] * 20] * 20] * 5]},
    ],
    ids=["long-text", "many-hosts", "long-lists", "nested"],
)
def test_a_record_over_its_budget_is_cut_to_fit_and_says_so(evidence: dict[str, object]) -> None:
    # Given a decision whose evidence alone is far over the budget
    record = audit(**evidence)
    assert record_budget.size(record) > BUDGET

    # When it is fitted
    kept = record_budget.fit(record, BUDGET)

    # Then it fits, says it was cut, and keeps what says what was decided
    assert record_budget.size(kept) <= BUDGET
    assert kept[record_budget.CUT_KEY] is True
    assert {k: kept[k] for k in ("at", "job", "diagnosis", "action")} == {
        "at": 1.5,
        "job": "llama",
        "diagnosis": "hang",
        "action": "warn",
    }
    assert kept["reasons"] == ["no step"]


def test_a_record_that_no_step_fits_keeps_its_top_level_scalars_cut_short() -> None:
    record = {"job": "j" * 300_000, "reasons": ["r" * 1_000] * 1_000, "at": 2.0}
    kept = record_budget.fit(record, 300)
    assert record_budget.size(kept) <= 300
    assert kept == {"job": "j" * (record_budget.LAST_TEXT_CHARS - 1) + "…", "at": 2.0, record_budget.CUT_KEY: True}


def test_values_json_does_not_know_are_sized_and_cut_as_their_text() -> None:
    record = {"when": object(), "evidence": {"t": {1, 2, 3}}, "big": "b" * 10_000}
    kept = record_budget.fit(record, 2_000)
    assert record_budget.size(kept) <= 2_000
