"""Notebook 07b's blind round (tests/blind_07b.py): wrong and unusual right answers written by a
helper who saw only the notebook and toy_engine/, each run through its check as the notebook
calls it.  0 false passes: every wrong answer fails, every right one passes.  The prediction
checks judge the buggy runs the notebook makes, made once here."""

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import pool
from overlap_course.labs import plugins, plugins_2026, shipped_2026

from blind_07b import BLIND

P5 = pool.PROMPTS + ["A little cat"]


@pytest.fixture(scope="module")
def buggy_runs():
    """The engines the notebook's prediction cells pass, right after their buggy runs."""
    title = plugins_2026.title_ring_engine()
    with plugins.ring(3):
        title.generate(pool.PROMPTS, max_new_tokens=16,
                       loop=plugins_2026.batch_queue(2, shipped_2026.before_sample))
    zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3))
    zos.generate(P5, max_new_tokens=16, stop=[" the"],
                 loop=plugins_2026.future_key(shipped_2026.key))
    yield {"check_stale_mask": title, "check_token_leak": zos}
    zos.close()


@pytest.mark.parametrize("entry", BLIND, ids=[f"{e.check}-{e.name}" for e in BLIND])
def test_blind_answer_gets_the_right_verdict(entry, buggy_runs):
    check = getattr(checks, entry.check)
    args = (buggy_runs[entry.check],) if entry.check in buggy_runs else ()
    verdict = check(entry.answer, *args)
    if entry.wrong:
        assert not verdict.passed, f"FALSE PASS ({entry.why}): {verdict!r}"
    else:
        assert verdict.passed, f"a right answer failed ({entry.why}): {verdict!r}"
    assert "Traceback" not in verdict.message
