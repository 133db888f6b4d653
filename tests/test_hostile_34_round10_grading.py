"""Issue 34, round ten, grading: a right value answer given as a NumPy array or a pandas Series
passed the checker in the kernel and scored 0 in the judge (its carrier refused it); a Mapping
that is not a dict (``MappingProxyType``: read by all its keys; ``UserDict``, ``ChainMap``:
refused for ``collections.abc``'s ``__eq__``) got another verdict in the judge than in the
kernel.  The kernel's checker and the judge must agree.  Each failed when written."""

from __future__ import annotations

import collections
import itertools
import types

import numpy as np
import pytest

from overlap_course import checks
from overlap_course.build import judge, judge_values
from overlap_course.checks.answers import MAX_ITEMS

RIGHT_ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
               ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]
FIELDS = ["seqlens_k", "positions", "slot_mapping", "input_ids"]
MARKS = {**dict.fromkeys(FIELDS, True), "seqlens_q": False, "rows": False, "block_tables": False}
ONLY_K = {**dict.fromkeys(MARKS, False), "seqlens_k": True}  # the right keys, wrong marks


def _carried(value):
    """``value`` as the check's judge process receives it."""
    return judge_values.decode(judge_values.encode(value))


def _series(values):
    return pytest.importorskip("pandas").Series(values)


# ------------------------------------------------------------------ 1: arrays and Series


@pytest.mark.parametrize("make", [
    lambda: np.array(FIELDS), lambda: np.array(FIELDS, dtype=object), lambda: _series(FIELDS),
], ids=["str-array", "object-array", "series"])
def test_an_array_of_names_is_carried_as_its_items(make):
    value = make()
    assert checks.check_metadata_answer(value).passed
    sent = _carried(value)
    assert sent == FIELDS and all(type(x) is str for x in sent)
    assert checks.check_metadata_answer(sent).passed


@pytest.mark.parametrize("make", [
    lambda: np.array(RIGHT_ORDER, dtype=object), lambda: _series(RIGHT_ORDER),
], ids=["2d-object-array", "series"])
def test_an_array_of_pairs_is_carried_as_the_checker_reads_it(make):
    sent = _carried(make())
    assert [tuple(x) for x in sent] == RIGHT_ORDER
    assert checks.check_three_rounds(make()).passed and checks.check_three_rounds(sent).passed


def test_what_the_checker_refuses_in_an_array_the_judge_refuses_too():
    for value in (np.array(FIELDS[:2]), np.array([FIELDS]), np.array("seqlens_k")):
        assert not checks.check_metadata_answer(value).passed
        try:
            sent = _carried(value)
        except ValueError:
            continue  # not carried: the judge's verdict is a failure
        assert not checks.check_metadata_answer(sent).passed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cell", [
    f"import numpy as np\nneeds_correction = np.array({FIELDS!r})\n",
    f"import pandas as pd\nneeds_correction = pd.Series({FIELDS!r})\n",
], ids=["array", "series"])
def test_the_judge_passes_an_array_answer_as_the_kernel_does(cell):
    if "pandas" in cell:
        pytest.importorskip("pandas")
    passed, message = judge.judge("check_metadata_answer", [cell])
    assert passed, message


@pytest.mark.timeout(300)
def test_the_judges_reading_of_an_array_order_is_the_kernels():
    """The reading process alone: the check's own process runs the engine, whose device
    process a worktree's judge cannot start (the editable install points elsewhere)."""
    cell = f"import numpy as np\norder = np.array({RIGHT_ORDER!r}, dtype=object)\n"
    request = {"check": "check_three_rounds", "names": ["order"], "cells": [cell],
               "private": []}
    read = judge._run_judge("answers", request, judge.compiled_digest())
    assert "values" in read, read
    [sent] = [judge_values.decode(v) for v in read["values"]]
    assert checks.check_three_rounds(sent).passed


# ------------------------------------------------------------------ 2: Mappings


MAPPINGS = ["types.MappingProxyType", "collections.UserDict", "collections.ChainMap"]


@pytest.mark.parametrize("maker", MAPPINGS)
@pytest.mark.parametrize("marks", [MARKS, ONLY_K], ids=["right", "right-keys-wrong-marks"])
def test_a_mapping_is_carried_by_its_marks(maker, marks):
    value = eval(f"{maker}({marks!r})")  # noqa: S307 - the test's own text
    sent = _carried(value)
    assert sent == marks and type(sent) is dict
    kernel = checks.check_metadata_answer(value)
    assert kernel.passed is (marks is MARKS)
    assert checks.check_metadata_answer(sent) == kernel


@pytest.mark.timeout(400)
@pytest.mark.parametrize("maker", MAPPINGS)
def test_the_judge_gives_a_mapping_the_kernels_verdict(maker):
    cells = [f"import types, collections\nneeds_correction = {maker}({MARKS!r})\n"]
    passed, message = judge.judge("check_metadata_answer", cells)
    assert passed, message
    if maker == MAPPINGS[0]:  # read by its marks, not by all its keys
        cells = [f"import types\nneeds_correction = {maker}({ONLY_K!r})\n"]
        passed, message = judge.judge("check_metadata_answer", cells)
        assert not passed and "also stale" in message, message


def test_an_endless_mapping_is_read_within_the_bound():
    class Endless(collections.abc.Mapping):
        def __getitem__(self, key):
            return True

        def __iter__(self):
            return itertools.count()

        def __len__(self):
            return 1

    sent = _carried(Endless())
    assert len(sent) == MAX_ITEMS + 1 and set(sent.values()) == {True}


def test_an_eq_the_submission_wrote_is_still_refused():
    space: dict = {}
    exec(compile("class Always(dict):\n    def __eq__(self, other):\n        return True\n"
                 "value = Always(seqlens_k=True)\n", "<submission cell 1>", "exec"), space)
    with pytest.raises(ValueError, match="__eq__` of its own"):
        judge_values.encode(space["value"])
    assert judge_values.encode(types.MappingProxyType({"a": True})) == [
        "dict", [[["str", "a"], ["bool", True]]]]
