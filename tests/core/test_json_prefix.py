"""A document cut at a limit is read as far as it is whole (`core.json_prefix`): a dump line over its length, a
subscription payload over its size."""

from __future__ import annotations

import json

import pytest

from stallwatch.core import json_prefix

DOCUMENT = {
    "messageType": "DATA_MESSAGE",
    "logGroup": "/aws/sagemaker/TrainingJobs",
    "logEvents": [{"id": str(i), "timestamp": 1700000000000 + i, "message": f'line {i} "quoted" é'} for i in range(50)],
}


def test_a_whole_document_reads_as_json_reads_it() -> None:
    text = json.dumps(DOCUMENT)
    assert json_prefix.read(text) == (DOCUMENT, True)
    assert json_prefix.read("  " + text + " trailing", 0) == (DOCUMENT, True)


@pytest.mark.parametrize("cut", range(1, len(json.dumps(DOCUMENT)), 37))
def test_a_cut_document_keeps_the_records_read_whole_before_the_cut(cut: int) -> None:
    # Given the document cut anywhere
    text = json.dumps(DOCUMENT)[:cut]

    # When it is read
    value, whole = json_prefix.read(text)

    # Then it is not whole, and every record it kept is one of the document's, in order, whole
    assert not whole
    events = value.get("logEvents", [])
    assert events == DOCUMENT["logEvents"][: len(events)]
    assert all(value[key] == DOCUMENT[key] for key in value if key != "logEvents")


def test_a_member_cut_inside_its_object_keeps_what_that_holds() -> None:
    assert json_prefix.read('{"a": 1, "b": {"c": 2, "d"') == ({"a": 1, "b": {"c": 2}}, False)
    assert json_prefix.read('{"a": [1, {"b": 2}, {"c": 3') == ({"a": [1, {"b": 2}]}, False)


@pytest.mark.parametrize("text", ['{"a": 12', '{"a": tr', '{"a": "unterminated', '{"a": 1, "b" 2}', '{"a" '])
def test_a_value_the_cut_may_have_shortened_or_that_is_not_json_is_left_out(text: str) -> None:
    value, whole = json_prefix.read(text)
    assert not whole
    assert value in ({}, {"a": 1})


def test_nesting_past_the_bound_is_read_as_the_cut_not_a_recursion_error() -> None:
    # json's own decoder raises RecursionError on this
    text = '{"a": ' + "[" * 100_000 + "]" * 100_000 + ', "b": 1}'
    with pytest.raises(RecursionError):
        json.loads(text)
    value, whole = json_prefix.read(text)
    assert (value, whole) == ({"a": []}, False)


@pytest.mark.parametrize("text", ["", "   ", "12", '"text"', "null", "garbage {"])
def test_a_text_that_begins_with_no_object_or_array_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="no JSON object or array"):
        json_prefix.read(text)
