"""The mutation corpus (tests/mistakes.py): every wrong answer gets its verdict category
(0 false passes), every correct alternative passes, and the instructor guide lists them."""

from pathlib import Path

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import sandbox

from mistakes import RIGHT, WRONG

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "instructor_guide.md"


@pytest.fixture(scope="module")
def serial_run():
    """A finished serial run for the idle-fraction exercise (02b)."""
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)) as engine:
        engine.generate(["Once upon a time", "The bird said", "There was a fox"], max_new_tokens=24)
        yield engine


def check(entry, serial_run):
    answer = entry.answer
    return {
        "02a": lambda: checks.check_serial_loop(answer),
        "02b": lambda: checks.check_idle_fraction(answer, serial_run),
        "03a": lambda: checks.check_zos_loop(answer),
        "03b": lambda: checks.check_three_rounds(answer),
        "04a": lambda: checks.check_correction(answer),
        "04b": lambda: checks.check_metadata_answer(answer),
        "05": lambda: checks.check_process_outputs(answer),
    }[entry.exercise]()


@pytest.mark.parametrize("entry", WRONG, ids=[f"{e.exercise}-{e.name}" for e in WRONG])
def test_wrong_answer_fails_with_its_category(entry, serial_run, monkeypatch):
    if entry.category == "time_limit":  # the same stop as at the real 30 s, sooner
        monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 1.5)
    verdict = check(entry, serial_run)
    assert not verdict.passed, f"FALSE PASS: {verdict!r}"
    assert verdict.category == entry.category, repr(verdict)
    assert "Traceback" not in verdict.message


@pytest.mark.parametrize("entry", RIGHT, ids=[f"{e.exercise}-{e.name}" for e in RIGHT])
def test_correct_alternative_passes(entry, serial_run):
    verdict = check(entry, serial_run)
    assert verdict.passed, repr(verdict)


def test_corpus_is_large_and_listed_in_the_instructor_guide():
    assert len(WRONG) >= 40 and {e.exercise for e in WRONG} >= {"02a", "03a", "04a", "05"}
    table = GUIDE.read_text()
    missing = [f"{e.exercise} {e.name}" for e in WRONG if f"| {e.exercise} | {e.name} |" not in table]
    assert not missing, f"add these corpus entries to the common-mistakes table of {GUIDE.name}: {missing}"
