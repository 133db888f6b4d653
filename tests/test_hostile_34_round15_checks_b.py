"""Round fifteen's blind cases B-F (issue 34): exercise 04's correction judged beyond k = 2 and
three requests, and its seqlens_k on every batch of the engine run; an abort that takes a
waiting request out of the queue unmarked; placeholder answers, non-functions and negative
rounds named for what they are."""

import torch

from overlap_course import checks
from overlap_course.labs import plugins
import toy_engine as te

from mistakes import correction


def _shift(meta, accepted, block_size):
    """Positions and slots corrected as the engine does; the delta per request."""
    delta = accepted[meta["rows"]] * meta["pending"]
    tok = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                  meta["seqlens_q"],
                                  output_size=len(meta["positions"]))
    meta["positions"] += delta[tok]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][tok, pos // block_size] * block_size
                               + pos % block_size)
    return delta


def k_written_in(meta, accepted, block_size):
    """seqlens_k as 'last position + 1' with the worked case's k = 2 written in."""
    _shift(meta, accepted, block_size)
    start = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
    meta["seqlens_k"].copy_(meta["positions"][start + 2] + 1)


def worked_shape_only(meta, accepted, block_size):
    """seqlens_k corrected only in the worked case's 9-token shape."""
    delta = _shift(meta, accepted, block_size)
    if meta["positions"].shape[0] == 9:
        meta["seqlens_k"] += delta


def hand_made_shapes_only(meta, accepted, block_size):
    """seqlens_k corrected only in the shapes of every hand-made case: only the engine run
    can tell (its batches are of 8 and 12 tokens)."""
    delta = _shift(meta, accepted, block_size)
    if meta["positions"].shape[0] in (9, 18, 4, 20, 5, 6):
        meta["seqlens_k"] += delta


def batch_of_three(meta, accepted, block_size):
    """The shift taken for three requests (B = 3 written in)."""
    delta = _shift(meta, accepted, block_size)
    meta["seqlens_k"][:3] += delta[:3]


def test_a_key_length_with_k_written_in_fails_on_a_case_with_another_k():
    v = checks.check_correction(k_written_in)
    assert not v and v.category in ("seqlens_k", "raised"), v
    assert "with k = 3" in v.message and "expected [12]" in v.message


def test_a_correction_done_only_in_the_worked_shape_fails():
    v = checks.check_correction(worked_shape_only)
    assert not v and "seqlens_k" in v.message, v


def test_a_wrong_seqlens_k_in_the_engine_run_is_named_with_its_batch():
    v = checks.check_correction(hand_made_shapes_only)
    assert not v and v.category == "seqlens_k", v
    assert "in the engine" in v.message and "your seqlens_k is" in v.message
    assert "expected" in v.message and "a real attention kernel reads seqlens_k" in v.message


def test_a_right_correction_and_new_tensors_pass_and_the_engine_is_healthy_after():
    assert not checks.check_correction(hand_made_shapes_only)
    v = checks.check_correction(correction)  # the engine's own is refused (engine_fix)
    assert v, v
    assert "the 10 cases are right" in v.message


def test_each_likely_slip_differs_from_the_right_answer_on_the_new_cases():
    from overlap_course.checks import correction_cases  # new in this fix: fails before it
    slips = (k_written_in, worked_shape_only, batch_of_three)
    for slip in slips:
        wrong = 0
        for meta, accepted, block_size, want, _ in correction_cases.cases():
            try:
                slip(meta, accepted, block_size)
            except IndexError:
                wrong += 1
                continue
            wrong += {n: meta[n].tolist() for n in want} != want
        assert wrong, slip.__name__
    ks = {k for k, *_ in correction_cases.CASES}
    sizes = {len(rows) for _, _, rows, _, _ in correction_cases.CASES}
    assert {0, 1}.issubset(ks) and max(ks) >= 3 and {1, 2}.issubset(sizes) and max(sizes) >= 4


def abort_unmarked(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finished:
        return
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
        return
    req.finish_reason = "abort"
    engine.scheduler.release_if_done(req)


def test_an_abort_that_leaves_a_waiting_request_unmarked_fails_named():
    v = checks.check_abort(abort_unmarked)
    assert not v and v.category == "not_marked", v
    assert "waiting" in v.message and "finish_reason" in v.message


def test_placeholders_are_named_as_the_values_they_are():
    for v, name in ((checks.check_three_rounds(None), "`order` is still None"),
                    (checks.check_metadata_answer(None), "`needs_correction` is still None")):
        assert not v and v.category == "not_implemented"
        assert name in v.message and "raises" not in v.message


def test_a_non_function_is_refused_before_anything_runs():
    for v, call in ((checks.check_serial_loop(0), "serial_loop(engine)"),
                    (checks.check_wants_more("x"), "wants_more(req)"),
                    (checks.check_ring_slots("2"), "ring_slots(depth)"),
                    (checks.check_correction(3), "correct_seqlens_qk(meta, accepted, block_size)"),
                    (checks.check_commit([]), "commit(req, tokens, eos_id, decode)")):
        assert not v and v.category == "shape", v
        assert "must be a function, " + call in v.message and "raised" not in v.message


def test_the_stub_none_is_not_answered_yet_in_every_check_that_takes_a_function():
    """None is the shipped stub: "not answered yet" (round 2's rule), never "raised"."""
    for v, call in ((checks.check_serial_loop(None), "serial_loop(engine)"),
                    (checks.check_idle_fraction(None, None), "idle_fraction(timeline)"),
                    (checks.check_wants_more(None), "wants_more(req)"),
                    (checks.check_commit(None), "commit(req, tokens, eos_id, decode)")):
        assert not v and v.category == "unanswered", v
        assert "must be a function, " + call in v.message and "raised" not in v.message


def test_a_negative_round_is_refused_as_no_round():
    engine = plugins.ring_engine()
    race = None
    prompts = ["Once upon a time", "One day, the little", "There was a fox"]
    with plugins.ring(3):
        try:
            engine.generate(prompts, max_new_tokens=8, loop=plugins.keep_in_flight(4))
        except te.RaceError as err:
            race = err
    engine.close()
    assert race is not None
    for answer in ((-2, 1), (1, -1)):
        v = checks.check_ring_race(answer, race, ring=3)
        assert not v and v.category == "no_such_round", v
        assert "numbered from 0" in v.message and "upload" not in v.message
