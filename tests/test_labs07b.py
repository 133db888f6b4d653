"""Notebook 07b's labs ("bugs of 2026"): each bug, put back through a plug-in loop, shows its
symptom in the engine's own runs and is gone with the engine's own default; each prediction is
judged against the buggy run; the notebook's learner cells start from the shipped bugs
(overlap_course/labs/shipped_2026.py)."""

import inspect
from pathlib import Path

import nbformat
import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import lesson07b, pool
from overlap_course.labs import plugins, plugins_2026, shipped_2026

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "07b_bugs_of_2026.ipynb"
PROMPTS = pool.PROMPTS
JUNK = [None, "", "12", 3.5, True, [], [None], {"a": 1}, object(), float("nan"), 10**400,
        (6, {"a": 1})]


def rejects(verdict, category):
    assert not verdict.passed and verdict.category == category, repr(verdict)
    assert "Traceback" not in verdict.message


@pytest.fixture(scope="module")
def shipped_queue():
    """The title-case engine right after the shipped queue of two, and the serial texts."""
    engine = plugins_2026.title_ring_engine()
    serial = [c.text for c in engine.generate(PROMPTS, max_new_tokens=16,
                                              loop=te.loops.serial_loop)]
    zos = [c.text for c in engine.generate(PROMPTS, max_new_tokens=16)]
    assert zos == serial  # the toy's ZOS order builds every mask in time
    queue = plugins_2026.batch_queue(2, shipped_2026.before_sample)
    with plugins.ring(3):
        engine.generate(PROMPTS, max_new_tokens=16, loop=queue)
    return engine, serial


def test_lab5_the_shipped_queue_breaks_title_case_one_token_late(shipped_queue):
    engine, serial = shipped_queue
    text, first_space = engine.completions[0].text, serial[0].index(" ")
    assert text != serial[0] and lesson07b.first_stray_capital(serial[0]) is None
    # the mask is built from round N - 2's token
    assert lesson07b.first_stray_capital(text) == first_space + 2
    assert checks.check_stale_mask(first_space + 2, engine).passed
    for answer, category in ((first_space + 1, "at_the_space"), (first_space + 3, "off_by_one"),
                             (0, "wrong"), ("3", "shape")):
        rejects(checks.check_stale_mask(answer, engine), category)


@pytest.mark.parametrize("depth", [2, 3])
def test_lab5_a_queue_holds_depth_minus_one_steps_at_each_sample(depth):
    """Once full, the queue processes its oldest step after the forward: depth - 1 stay at the
    sample."""
    with plugins.ring(depth + 1):
        plugins.ring_engine().generate(PROMPTS, max_new_tokens=8,
                                       loop=plugins_2026.batch_queue(depth, lambda *a: 0))
    held = lesson07b.in_flight_at_samples(plugins.ring_engine().record.events)
    assert max(held) == depth - 1 and held[:2] == [0, 0]  # a prefill, then the first decode


@pytest.fixture(scope="module")
def shipped_key():
    engine = pool.engine()
    prompts = list(lesson07b.LEAK_PROMPTS)
    own = [c.token_ids for c in engine.generate(prompts, max_new_tokens=16, stop=[" the"])]
    outs = engine.generate(prompts, max_new_tokens=16, stop=[" the"],
                           loop=plugins_2026.future_key(shipped_2026.key))
    return engine, own, [c.token_ids for c in outs]


def test_lab6_the_batch_place_key_leaks_tokens_once_a_request_leaves(shipped_key):
    engine, own, got = shipped_key
    assert got[0] == own[0] and got[1] != own[1]  # prompt 0 stops first; the others move up a place
    assert lesson07b.leaks(engine.record.events)[:2] == [(6, 1, 0), (6, 2, 1)]
    assert checks.check_token_leak((6, {1: 0, 2: 1}), engine).passed
    for answer, category in (((5, {1: 0, 2: 1}), "wrong_round"), ((6, {1: 0}), "wrong_reader"),
                             ((6, {1: 2, 2: 0}), "wrong_owner"), ((6, [1, 0]), "shape")):
        rejects(checks.check_token_leak(answer, engine), category)


def test_lab6_the_leak_needs_overlap_the_serial_loop_has_nothing_in_flight():
    engine, prompts = pool.engine(), list(lesson07b.LEAK_PROMPTS)
    own = [c.token_ids for c in engine.generate(prompts, max_new_tokens=16, stop=[" the"])]
    keyed = plugins_2026.future_key(shipped_2026.key)
    got = engine.generate(prompts, max_new_tokens=16, stop=[" the"], loop=keyed)
    assert [c.token_ids for c in got] != own
    assert lesson07b.leaks(engine.record.events)
    serial = engine.generate(prompts, max_new_tokens=16, stop=[" the"], loop=te.loops.serial_loop)
    assert [c.token_ids for c in serial] == own


@pytest.mark.parametrize("junk", JUNK,  # the same id in every process (pytest-xdist)
                         ids=lambda junk: "object()" if type(junk) is object else repr(junk))
def test_no_prediction_check_raises_on_junk(junk):
    for verdict in (checks.check_stale_mask(junk, pool.engine()),
                    checks.check_token_leak(junk, None)):
        assert not verdict.passed and "Traceback" not in verdict.message


def test_the_notebooks_learner_cells_start_from_the_shipped_bugs():
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    for fn in (shipped_2026.before_sample, shipped_2026.key):
        source = inspect.getsource(fn).rstrip("\n")
        assert any(c.startswith(source) and f"({fn.__name__})" in c for c in cells), fn.__name__


def test_the_notebook_states_the_runs_the_fix_checks_make():
    text = " ".join(c.source.replace("\n", " ") for c in nbformat.read(NOTEBOOK, as_version=4).cells
                    if c.cell_type == "markdown")
    depths = sorted({run[1] for run in lesson07b.QUEUE_RUNS})
    assert f"queues of {depths[0]} and {depths[1]} steps, with and without title case" in text
    assert any(run[2] for run in lesson07b.QUEUE_RUNS)
    assert "a stop string that ends requests" in text
    assert f"speculation with {pool.DRAFTS} drafts" in text and "five prompts on three rows" in text
    assert len(lesson07b.LEAK_PROMPTS) == 5


def test_the_plugins_refuse_bad_input_naming_it():
    for call, error, words in (
            (lambda: plugins_2026.batch_queue(0, lambda *a: 0), ValueError,
             "depth must be at least 1"),
            (lambda: plugins_2026.batch_queue(2, 3), TypeError, "before_sample must be a function"),
            (lambda: plugins_2026.future_key(None), TypeError, "key must be a function")):
        with pytest.raises(error, match=words):
            call()
    with pytest.raises(plugins_2026.BadAnswer, match="key returned 7 for prompt 0 .* from 0 to 2"):
        pool.engine().generate(PROMPTS, max_new_tokens=4,
                               loop=plugins_2026.future_key(lambda req, b: 7))


def test_the_site_the_readme_and_the_guide_list_07b_as_optional():
    repo = NOTEBOOK.parent.parent
    index = (repo / "site" / "index.md").read_text()
    assert "\nnotebooks/07b_bugs_of_2026\n" in index
    assert "{doc}`notebooks/07b_bugs_of_2026` | *optional:*" in index
    readme = (repo / "README.md").read_text()
    assert "| `notebooks/07b_bugs_of_2026` | *optional:*" in readme
    guide = (repo / "docs" / "instructor_guide.md").read_text()
    assert "07b Bugs of 2026 (optional: homework" in guide and "tests/labs07b_corpus.py" in guide
