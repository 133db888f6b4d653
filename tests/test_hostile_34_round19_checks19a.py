"""Issue 34, round nineteen's blind learner on the notebooks' checks (cases A to F of
/work/round19/blindA/REPORT.md).  Each message named a mistake the answer did not make, or two
checks said different things of one answer: an abort that freed the blocks itself was told
"nobody freed it", one that found its request "Did it find the request?"; (6, {}) got a format
complaint; round -1 and a count of -3 were judged as real values; a generator of the right
values passed some checks and failed others."""

from __future__ import annotations

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import pool
from overlap_course.checks.verdict import no_such_round
from overlap_course.labs import plugins, plugins_2026, shipped, shipped_2026

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]


@pytest.fixture(autouse=True)
def _record(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAP_PROGRESS_FILE", str(tmp_path / "progress.jsonl"))


def _request(engine, request_id):
    return next(r for r in engine.requests if r.id == request_id)


# ------------------------------------------------------------------ F and A: check_abort

def _abort_freeing_blocks_only(engine, request_id):
    """Marks, empties the waiting queue, and gives the blocks back itself: row and `running`
    entry stay behind (wrong)."""
    req = _request(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
        return
    if req.num_inflight == 0 and req.blocks:
        engine.scheduler.blocks.free(req.blocks, req.index)
        req.blocks = []


def _abort_capping_the_limit(engine, request_id):
    """Finds the request by id, then caps its limit instead of marking it "abort" (wrong)."""
    req = _request(engine, request_id)
    if not req.finished:
        req.max_new_tokens = len(req.output_ids)


def _abort_doing_nothing(engine, request_id):
    """Never touches a request: the lookup hint is the one to give."""


def test_an_abort_that_freed_the_blocks_itself_is_told_so():
    verdict = checks.check_abort(_abort_freeing_blocks_only)
    assert not verdict.passed and verdict.category == "kept_blocks", verdict
    assert "nobody freed it" not in verdict.message, verdict
    assert "gave its KV blocks back itself" in verdict.message, verdict
    assert "engine.scheduler.free(req)" in verdict.message, verdict


def test_an_abort_that_found_its_request_is_told_what_it_changed():
    verdict = checks.check_abort(_abort_capping_the_limit)
    assert not verdict.passed and verdict.category == "not_marked", verdict
    assert "Did it find the request" not in verdict.message, verdict
    assert "changed its `max_new_tokens`" in verdict.message, verdict
    assert 'req.finish_reason = "abort"' in verdict.message, verdict


def test_an_abort_that_touches_nothing_still_gets_the_lookup_hint():
    verdict = checks.check_abort(_abort_doing_nothing)
    assert not verdict.passed and verdict.category == "wrong_request", verdict
    assert "Did it find the request" in verdict.message, verdict


# ------------------------------------------------------------------ B and C: 07b's token leak

@pytest.fixture(scope="module")
def leak_engine():
    """Notebook 07b's engine right after the shipped key's run."""
    zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3))
    zos.generate(pool.PROMPTS + ["A little cat"], max_new_tokens=16, stop=[" the"],
                 loop=plugins_2026.future_key(shipped_2026.key))
    yield zos
    zos.close()


def test_an_empty_dict_is_judged_for_what_it_claims(leak_engine):
    verdict = checks.check_token_leak((6, {}), leak_engine)
    assert not verdict.passed and verdict.category == "wrong_reader", verdict
    assert "maps prompt numbers" not in verdict.message, verdict
    assert "no request took another's token" in verdict.message, verdict
    assert checks.check_token_leak((6, {1: 0, 2: 1}), leak_engine).passed


def test_round_minus_one_is_no_round_in_the_leak_and_abort_questions(leak_engine):
    assert checks.check_token_leak((-1, {1: 0}), leak_engine) == no_such_round(-1)
    engine = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3))
    try:
        with pytest.raises(te.RaceError) as race:
            engine.generate(PROMPTS, max_new_tokens=12,
                            on_round=plugins.aborts(shipped.abort, [(5, 1)]))
    finally:
        engine.close()
    assert checks.check_abort_in_flight(({-1}, set()), race.value) == no_such_round(-1)
    assert checks.check_abort_in_flight((set(), {-2}), race.value) == no_such_round(-2)
    assert checks.check_abort_in_flight(({4}, set()), race.value).passed


# ------------------------------------------------------------------ D: a generator of the values

def test_a_generator_of_the_right_values_passes_every_list_question():
    slots = dict(positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4)
    assert checks.check_corrected_slots((20 + i for i in range(3)), **slots).passed
    assert checks.check_corrected_slots(map(int, "20 21 22".split()), **slots).passed
    meta = {"input_ids": [-1, 7, -1], "pending": [1, 0, 1]}
    assert checks.check_future_inputs((v for v in (-1, 7, -1)), (p for p in (1, 0, 1)), meta).passed
    assert checks.check_swapped_order((x for x in (True, False)), True, False).passed


def test_a_wrong_or_endless_generator_still_fails():
    slots = dict(positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4)
    assert not checks.check_corrected_slots((i for i in (24, 25, 26)), **slots).passed

    def endless():
        while True:
            yield 20
    verdict = checks.check_corrected_slots(endless(), **slots)
    assert not verdict.passed and verdict.category == "junk", verdict


# ------------------------------------------------------------------ E: a negative count

def test_a_negative_count_gets_one_wording():
    spec = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=3))
    zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
    try:
        spec.generate(PROMPTS, max_new_tokens=30, stop=[" was", "."],
                      on_round=plugins.per_request(commit=shipped.commit))
        zos.generate(PROMPTS, max_new_tokens=8)
        verdict = checks.check_overshoot(-3, spec)
        assert verdict.category == "negative" and "cannot be negative" in verdict.message, verdict
        assert verdict == checks.check_discarded(-3, zos)  # the same words for every count
        assert checks.check_overshoot(3, spec).passed
    finally:
        spec.close()
        zos.close()
