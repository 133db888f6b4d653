"""Notebook 07's labs ("bugs that shipped"): each bug, put back through a plug-in, shows its symptom
in the engine's own mechanics (outputs against the serial run, discarded rounds, the race checker)
and is gone with the engine's own default; each prediction is judged against the buggy run; the
notebook's learner cells start from the shipped bugs (overlap_course/labs/shipped.py)."""

import inspect
from pathlib import Path

import nbformat
import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import pool
from overlap_course.labs import plugins, shipped
from toy_engine.record import Free

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "07_bugs_that_shipped.ipynb"
PROMPTS = pool.PROMPTS
JUNK = [None, "", "12", 3.5, True, [], [None], {"a": 1}, object(), float("nan"), 10**400]


def ids(outs):
    return [c.token_ids for c in outs]


def rejects(verdict, category):
    assert not verdict.passed and verdict.category == category, repr(verdict)
    assert "Traceback" not in verdict.message


def test_lab1_the_shipped_policy_wastes_a_round_per_request_only_under_overlap():
    engine = pool.engine()
    serial = ids(engine.generate(PROMPTS, max_new_tokens=12, loop=te.loops.serial_loop))
    shipped_policy = plugins.per_request(wants_more=shipped.wants_more)
    assert ids(engine.generate(PROMPTS, max_new_tokens=12, on_round=shipped_policy, loop=te.loops.serial_loop)) \
        == serial and engine.stats.discarded_outputs == 0
    assert ids(engine.generate(PROMPTS, max_new_tokens=12)) == serial and engine.stats.discarded_outputs == 0
    own_rounds = engine.stats.rounds
    assert ids(engine.generate(PROMPTS, max_new_tokens=12, on_round=shipped_policy)) == serial
    assert engine.stats.discarded_outputs == len(PROMPTS) and engine.stats.rounds == own_rounds + 2  # two batches
    assert checks.check_wasted_round((11, 1), engine).passed
    for answer, category in (((12, 0), "misses_in_flight"), ((11, 0), "misses_in_flight"),
                             ((12, 1), "already_processed"), ((10, 2), "wrong"), ((11,), "shape")):
        rejects(checks.check_wasted_round(answer, engine), category)


def test_lab2_the_shipped_abort_frees_under_a_launched_round_only_under_overlap():
    engine, at = pool.engine(), [(5, 1)]
    outs = engine.generate(PROMPTS, max_new_tokens=12, loop=te.loops.serial_loop,
                           on_round=plugins.aborts(shipped.abort, at))
    assert outs[1].finish_reason == "abort"
    own = engine.generate(PROMPTS, max_new_tokens=12, on_round=plugins.aborts(lambda e, i: e.abort(i), at))
    assert own[1].finish_reason == "abort" and not any(f.in_use for f in engine.record.of(Free))
    with pytest.raises(te.RaceError) as caught:
        engine.generate(PROMPTS, max_new_tokens=12, on_round=plugins.aborts(shipped.abort, at))
    err = caught.value
    assert (err.kind, err.round, err.prompt) == ("free_in_use", 4, 1)
    assert checks.check_abort_in_flight(({4}, set()), err).passed
    assert checks.check_abort_in_flight(([4], {}), err).passed
    for answer, category in ((({5}, set()), "not_launched_yet"), (({3, 4}, set()), "already_processed"),
                             (({4}, {4}), "serial_discards_nothing"), ((set(), set()), "misses_in_flight"),
                             ({4}, "shape")):
        rejects(checks.check_abort_in_flight(answer, err), category)


def test_lab3_a_ring_smaller_than_the_rounds_held_races_and_a_larger_one_does_not():
    engine = plugins.ring_engine()
    serial = ids(engine.generate(PROMPTS[:3], max_new_tokens=8, loop=te.loops.serial_loop))
    with plugins.ring(2):
        assert ids(engine.generate(PROMPTS[:3], max_new_tokens=8, loop=plugins.keep_in_flight(1))) == serial
        with pytest.raises(te.RaceError) as two_on_two:
            engine.generate(PROMPTS[:3], max_new_tokens=8, loop=plugins.keep_in_flight(2))
    assert (two_on_two.value.kind, two_on_two.value.buffer, two_on_two.value.round) == ("buffer", "meta1", 1)
    with plugins.ring(3):
        assert ids(engine.generate(PROMPTS[:3], max_new_tokens=8, loop=plugins.keep_in_flight(2))) == serial
        with pytest.raises(te.RaceError) as three_on_three:
            engine.generate(PROMPTS[:3], max_new_tokens=8, loop=plugins.keep_in_flight(3))
    assert te.engine.NUM_SLOTS == 2  # the ring is put back
    err = three_on_three.value
    assert checks.check_ring_race((1, 4), err, ring=3).passed
    for answer, category in (((1, 3), "wrong_slot"), ((4, 1), "order"), ((2, 5), "not_launched_yet"),
                             ((0, 3), "earlier_round"), ("1, 4", "shape")):
        rejects(checks.check_ring_race(answer, err, ring=3), category)


def test_lab4_the_shipped_commit_misses_stops_and_limits_inside_a_multi_token_step():
    spec, plain = pool.engine(num_draft_tokens=pool.DRAFTS), pool.engine()
    kw = dict(max_new_tokens=30, stop=[" was", "."])
    shipped_commit = plugins.per_request(commit=shipped.commit)
    serial = spec.generate(PROMPTS, loop=te.loops.serial_loop, **kw)
    assert ids(plain.generate(PROMPTS, on_round=shipped_commit, **kw)) == ids(serial)  # one token a round: right
    assert ids(spec.generate(PROMPTS, **kw)) == ids(serial)  # the engine's own commit
    buggy = spec.generate(PROMPTS, on_round=shipped_commit, **kw)
    assert " was" in buggy[0].text and serial[0].finish_reason == "stop"
    assert max(len(c.token_ids) for c in buggy) > 30
    assert checks.check_overshoot(3, spec).passed
    for answer, category in ((4, "off_by_one"), (2, "too_few"), (0, "too_few"), (5, "too_many"),
                             ("3", "shape")):
        rejects(checks.check_overshoot(answer, spec), category)


def test_lab3_every_depth_the_check_runs_races_one_slot_short_and_not_on_its_ring():
    """check_ring_slots runs depths 1 to MAX_SLOTS - 1: each must tell depth + 1 from depth."""
    from overlap_course.checks import lab_runs, lab_workloads
    assert lab_workloads.DEPTHS == tuple(range(1, te.config.MAX_SLOTS))
    for depth in lab_workloads.DEPTHS:
        assert lab_runs.ring_run(depth, depth + 1) == lab_runs.ring_reference(), depth
        assert isinstance(lab_runs.ring_run(depth, depth), te.RaceError), depth


@pytest.mark.parametrize("junk", JUNK,  # the same id in every process (pytest-xdist)
                         ids=lambda junk: "object()" if type(junk) is object else repr(junk))
def test_no_prediction_check_raises_on_junk(junk):
    for verdict in (checks.check_wasted_round(junk, pool.engine()), checks.check_abort_in_flight(junk, None),
                    checks.check_ring_race(junk, None, ring=3), checks.check_overshoot(junk, pool.engine())):
        assert not verdict.passed and "Traceback" not in verdict.message


def test_the_notebooks_learner_cells_start_from_the_shipped_bugs():
    """Each fix cell holds a copy of the shipped function, unchanged, and hands it to its check."""
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    for fn in (shipped.wants_more, shipped.abort, shipped.ring_slots, shipped.commit):
        source = inspect.getsource(fn).rstrip("\n")
        assert any(c.startswith(source) and f"({fn.__name__})" in c for c in cells), fn.__name__


def test_the_notebook_states_the_runs_the_fix_checks_make():
    """What a fix cell says its check runs follows the checks' own constants."""
    from overlap_course.checks import lab_runs, lab_workloads
    text = " ".join(c.source.replace("\n", " ") for c in nbformat.read(NOTEBOOK, as_version=4).cells
                    if c.cell_type == "markdown")
    limits = {r.max_new for r in lab_runs.POLICY_RUNS} - {lab_runs.POLICY_RUNS[0].max_new}
    assert all(f"a limit of {n}" in text for n in limits), limits
    held = max(r.held for r in lab_runs.POLICY_RUNS)
    assert {r.held for r in lab_runs.POLICY_RUNS} == {0, 1, held} and \
        f"`plugins.keep_in_flight({held})` on a ring of {held + 1}" in text
    depths = lab_workloads.DEPTHS
    assert f"every depth from {depths[0]} to {depths[-1]} (a ring has at most " \
           f"{te.config.MAX_SLOTS} slots)" in text


def test_the_plugins_refuse_bad_input_naming_it():
    for call, error, words in ((lambda: plugins.keep_in_flight(0), ValueError, "depth must be at least 1"),
                               (lambda: plugins.per_request(commit=3), TypeError, "commit must be a function"),
                               (lambda: plugins.aborts(None, [(1, 0)]), TypeError, "abort must be a function")):
        with pytest.raises(error, match=words):
            call()
    with pytest.raises(ValueError, match="prompt index 7 is not in this run, which has prompts 0 to 3"):
        pool.engine().generate(PROMPTS, max_new_tokens=4, on_round=plugins.aborts(shipped.abort, [(1, 7)]))


def test_checking_lab1_starts_no_engine_of_the_learners():
    """The check runs on the pool's ring engine; it warmed ``plugins.ring_engine()`` too, the
    learner's own, started for nothing on every check (and in every graded submission)."""
    for engine in list(plugins._LEARNERS.values()):
        engine.close()
    plugins._LEARNERS.clear()
    assert checks.check_wants_more(shipped.wants_more).passed is False
    assert "ring" not in plugins._LEARNERS
