"""Round twenty-seven's blind cases on exercises 03 and 05's checks (issue 34).

N1: exercise 03 (a): a ZOS loop calling `launch_sample` twice a round (the engine refuses the
second: its constraint mask write races the first sample's read) was told its step "was never
waited for and processed" and that round 2 reuses its buffer; caught in try/except, to add the
flush it has. `launch_forward` twice was named: both are now ("`launch_sample` was called 2
times"), the host lane's launch spans counting a refused call. N2: exercise 05: `req.text`
changed after `commit_outputs` was told to commit each step's tokens once; `req.output_ids`
cut was told "Do not append them again": each is named as changed after the commit, to leave
as the commit set it. N3: an abort at 3 tokens was told it ended early against a reference
"with 1 token(s)" (what the stop string left): the reference's committed count is named, and
the stop string's tokens it takes back off. N4: exercise 03 (b): ("flush", 4) was told why the
last round is flushed: the round is named wrong. N5: a 900k-item list was asked "(an endless
iterator?)"; "got int a 101-digit number", "is a int", "after 1 tokens": counts and articles.
"""

from overlap_course import checks
from overlap_course.checks import verdict


def _zos(engine, twice: bool):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
            previous = None
        step = engine.launch_sample(inputs)
        if twice:
            step = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(step)
        else:
            previous = step


def test_exercise_03_names_launch_sample_called_twice():
    v = checks.check_zos_loop(lambda engine: _zos(engine, True))
    assert not v.passed and v.category == "launched_twice", v
    assert "`launch_sample` was called 2 times" in v.message and "round 0" in v.message, v
    assert "never waited for" not in v.message, v


def test_exercise_03_names_launch_sample_called_twice_when_the_refusal_is_caught():
    def caught(engine):
        try:
            _zos(engine, True)
        except Exception:  # noqa: BLE001 - the learner's debugging
            pass
    v = checks.check_zos_loop(caught)
    assert not v.passed and v.category == "launched_twice", v
    assert "`launch_sample` was called 2 times" in v.message and "flush" not in v.message, v


def test_exercise_03_right_loop_still_passes():
    assert checks.check_zos_loop(lambda engine: _zos(engine, False)).passed


def _commit(engine, step, edit=None):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if edit is not None:
            edit(req)
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def test_exercise_05_names_a_text_changed_after_the_commit():
    v = checks.check_process_outputs(
        lambda engine, step: _commit(engine, step, lambda r: setattr(r, "text", r.text.upper())))
    assert not v.passed and v.category == "edits_requests", v
    assert "changed prompt" in v.message and "`req.text`" in v.message, v
    assert "leave `req.text` as the commit set it" in v.message, v


def test_exercise_05_names_tokens_taken_back_after_the_commit():
    def cut(req):
        if len(req.output_ids) > 5:
            req.output_ids = req.output_ids[:5]
    v = checks.check_process_outputs(lambda engine, step: _commit(engine, step, cut))
    assert not v.passed and v.category == "tokens_beside", v
    assert "took 1 token back off" in v.message and "as the commit set it" in v.message, v
    assert "append them again" not in v.message, v


def test_exercise_05_right_process_outputs_still_passes():
    assert checks.check_process_outputs(_commit).passed


def test_exercise_05_abort_compares_committed_tokens():
    def abort_at_three(engine, step):
        def abort(req):
            if len(req.output_ids) == 3 and not req.finished:
                engine.abort(req.id)
        _commit(engine, step, abort)
    v = checks.check_process_outputs(abort_at_three)
    assert not v.passed and v.category == "ended_unfinished", v
    assert "after 3 tokens" in v.message, v
    assert "ends 'stop', with 5 tokens, then takes the 4 of its stop string ' the' back off" \
        in v.message, v


_ROUNDS = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
           ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]


def test_exercise_03b_names_the_flushed_round():
    later = checks.check_three_rounds(_ROUNDS[:8] + [("flush", 4)])
    assert not later.passed and later.category == "wrong_round", later
    assert "its round is not" in later.message and "no round 4" in later.message, later
    earlier = checks.check_three_rounds(_ROUNDS[:8] + [("flush", 2)])
    assert "round 2 was postprocessed under round 3's forward" in earlier.message, earlier
    assert checks.check_three_rounds(_ROUNDS).passed


def test_exercise_03b_too_long_a_list_is_named_by_its_length():
    v = checks.check_three_rounds([("forward", 1)] * 900_000)
    assert not v.passed and v.category == "shape", v
    assert "yours has 900000 items, and the answer has 9" in v.message, v
    assert "endless" not in v.message, v


def test_articles_and_counts():
    assert "got 1 (an int)" in checks.check_three_rounds(1).message
    assert "got a 101-digit number (an int)" in checks.check_three_rounds(10**100).message
    assert (verdict.article("int"), verdict.article("list"), verdict.counted(1, "token"),
            verdict.counted(2, "time")) == ("an int", "a list", "1 token", "2 times")
