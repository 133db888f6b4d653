"""Issue 34, round twenty-seven: a time limit that fired in a frozen standard-library module
(``<frozen abc>``'s ``__instancecheck__``) named it as the learner's line, as every file named
``<...>`` was taken for a notebook cell's."""

from __future__ import annotations

import abc

from overlap_course.checks import sandbox


def test_a_frozen_module_is_not_the_learners_and_a_cell_is():
    assert abc.ABCMeta.__instancecheck__.__code__.co_filename == "<frozen abc>"
    assert sandbox._is_learners("<frozen abc>") is False
    assert sandbox._is_learners("<ipython-input-3-5f2a>") is True
    assert sandbox._is_learners("<string>") is True
