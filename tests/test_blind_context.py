"""The blind round on the checks' context arguments (tests/blind_context.py): every wrong answer
fails and every right one passes, with a verdict, never an exception.

Measured when it was written (issue 34): 81 cases, 0 false passes, 0 wrong failures; one case,
a closed engine's device given to check_race_fixed, raised DeviceError before lesson00 answered
it with a setup verdict."""

import pytest

from overlap_course import checks

from blind_context import CASES, EXTRA_CASES

ALL = CASES + EXTRA_CASES


@pytest.mark.parametrize("case,wrong,why", ALL, ids=[case.__name__ for case, _, _ in ALL])
def test_blind_context_answer(case, wrong, why):
    name, args, kwargs = case()
    verdict = getattr(checks, name)(*args, **kwargs)
    assert "Traceback" not in verdict.message
    if wrong:
        assert not verdict.passed, f"FALSE PASS ({why}): {verdict!r}"
    else:
        assert verdict.passed, f"WRONG FAILURE ({why}): {verdict!r}"


def test_the_blind_context_round_is_large_enough():
    targeted = {case()[0] for case, _, _ in ALL}
    assert len(ALL) >= 80 and sum(not wrong for _, wrong, _ in ALL) >= 5
    assert {"check_race", "check_race_fixed", "check_idle_fraction"} <= targeted
