"""A name cut to a limit stays unique (`core.names`): its start, then a hash of the whole."""

from __future__ import annotations

import pytest

from stallwatch.core import names


def test_a_name_within_its_limit_is_itself() -> None:
    assert names.within("stallwatch restart llm 1764496800", 100) == "stallwatch restart llm 1764496800"
    assert names.within("x" * 100, 100) == "x" * 100


def test_names_past_the_limit_that_share_their_start_stay_apart_within_it() -> None:
    a, b = "n" * 120 + "-a", "n" * 120 + "-b"
    cut = {names.within(a, 100), names.within(b, 100)}
    assert len(cut) == 2
    assert all(len(name) == 100 and name.startswith("n" * 87 + names.CUT_MARK) for name in cut)
    assert names.within(a, 100) == names.within(a, 100)  # the same name cuts the same way


def test_a_limit_with_no_room_before_the_hash_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        names.within("x" * 50, names.HASH_CHARS)
