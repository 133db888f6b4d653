"""Verdicts (overlap_course/checks/verdict.py): a category is always given and always one of the
vocabulary's, so the progress record and the tests read the mistake, never the message."""

import ast
from pathlib import Path

import pytest

from overlap_course import progress
from overlap_course.checks import verdict
from overlap_course.checks.verdict import CATEGORIES, Verdict

CHECKS = Path(verdict.__file__).parent


def test_a_verdict_needs_a_category_from_the_vocabulary():
    with pytest.raises(TypeError):
        Verdict(False, "no category")  # noqa -- the point of the test
    with pytest.raises(ValueError, match="CATEGORIES"):
        Verdict(False, "x", "not_a_category")
    with pytest.raises(ValueError):
        Verdict(True, "x", "wrong")  # a pass is "passed", and only a pass is
    with pytest.raises(ValueError):
        Verdict(False, "x", "passed")


def test_the_learner_reads_the_same_form():
    assert repr(verdict.passes("fine")) == "PASSED: fine" and verdict.passes("fine")
    v = verdict.fails("wrong", "not it")
    assert repr(v) == "NOT YET: not it" and not v
    assert verdict.unanswered("set `x`").message == "not answered yet: set `x`, then run this cell again"


def _literal_categories() -> dict[str, set[str]]:
    """Per checks module: the string literals given as a category, ``fails("...", ...)``."""
    found = {}
    for path in sorted(CHECKS.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fails" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
        found[path.name] = names
    return found


def test_every_category_a_check_names_is_in_the_vocabulary_and_every_one_is_used():
    named = set().union(*_literal_categories().values())
    assert named - CATEGORIES == set()
    # every name of the vocabulary appears in a check's source (as a literal, or a key of a mistakes table)
    sources = "\n".join(p.read_text() for p in CHECKS.glob("*.py") if p.name != "verdict.py")
    unused = {c for c in CATEGORIES - named - {verdict.PASSED} if f'"{c}"' not in sources}
    assert not unused, f"categories no check gives: {sorted(unused)}"
    assert progress.UNANSWERED <= CATEGORIES
