"""Notebook 07b's corpus (tests/labs07b_corpus.py): every wrong fix fails with its category and a
message without a traceback (0 false passes), every right fix written another way passes."""

import pytest

from overlap_course import checks

from labs07b_corpus import RIGHT, WRONG

CHECKS = {"5": checks.check_before_sample, "6": checks.check_future_key}


@pytest.mark.parametrize("fix", WRONG, ids=[f"lab{f.lab}-{f.name}" for f in WRONG])
def test_wrong_fix_fails_with_its_category(fix):
    verdict = CHECKS[fix.lab](fix.answer)
    assert not verdict.passed, f"FALSE PASS: {verdict!r}"
    assert verdict.category == fix.category, repr(verdict)
    assert "Traceback" not in verdict.message


@pytest.mark.parametrize("fix", RIGHT, ids=[f"lab{f.lab}-{f.name}" for f in RIGHT])
def test_right_fix_passes(fix):
    verdict = CHECKS[fix.lab](fix.answer)
    assert verdict.passed, repr(verdict)


def test_each_lab_has_five_wrong_fixes_and_two_other_right_ones():
    for lab in CHECKS:
        assert sum(f.lab == lab for f in WRONG) >= 5
        assert sum(f.lab == lab and f.name != "the reference" for f in RIGHT) >= 2
