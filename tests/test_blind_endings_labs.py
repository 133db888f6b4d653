"""The blind endings corpus (tests/blind_endings.py, issue 33), its entries for notebook 07's
checks: answers about finishing, freeing, aborts and limits, written by someone who saw only the
notebooks and ``toy_engine/``, each passed to its check in the state the notebook's cells leave
(``blind_labs.NotebookState``).  Every wrong answer must fail (0 false passes), every right one
pass (0 wrong failures); tests/test_blind_endings.py runs the other checks' entries.
"""

import pytest

from overlap_course.checks import lesson07

from blind_endings import BLIND
from blind_labs import NotebookState

LAB_CHECKS = set(lesson07.__all__)  # notebook 07's checks: its predictions and its fixes

# name -> why the answer is right although its author marked it wrong (the notebook's text)
RULED_RIGHT: dict[str, str] = {}
ENTRIES = [(a, a.wrong and a.name not in RULED_RIGHT) for a in BLIND if a.check in LAB_CHECKS]


@pytest.fixture(scope="module")
def notebook():
    state = NotebookState()
    yield state
    state.close()


@pytest.mark.parametrize("entry,wrong", ENTRIES, ids=[a.name for a, _ in ENTRIES])
def test_blind_endings_lab_answer(entry, wrong, notebook):
    verdict = notebook.verdict(entry)
    assert "Traceback" not in verdict.message, repr(verdict)
    if wrong:
        assert not verdict.passed, f"FALSE PASS ({entry.why}): {verdict!r}"
    else:
        assert verdict.passed, f"WRONG FAILURE ({entry.why}): {verdict!r}"


def test_every_fix_check_of_the_labs_has_blind_answers_both_ways():
    assert set(RULED_RIGHT) <= {a.name for a, _ in ENTRIES}
    for check in ("check_wants_more", "check_abort", "check_commit"):
        assert sum(w for a, w in ENTRIES if a.check == check) >= 5, check
        assert any(not w for a, w in ENTRIES if a.check == check), check
