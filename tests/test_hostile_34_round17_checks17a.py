"""Round seventeen's blind round A (issue 34): notebook 07's check_commit runs stop strings that
end on one token (the engine cuts the first in ``req.stop``) and one that follows a space;
exercise 02's and 03's loop checks, check_wants_more and check_commit name what the learner's
code did to a request (an abort, a finish reason, tokens appended, replaced or removed, a
setting), never the stage order or "the engine ended it"."""

import toy_engine as te
from overlap_course import checks
from toy_engine.sequence import Request

from loops_for_tests import zos_loop
import loops_for_tests

_STAGE_ORDER = ("each round must prepare, launch forward", "process every step exactly once")


def _commit(pick, strip_space=False):
    """The engine's commit, one token at a time, but ``pick(matches)`` chooses which of the stop
    strings the text ends with is cut; ``strip_space``: the whitespace before it is cut too."""
    def commit(req, tokens, eos_id, decode):
        for tok in tokens:
            if tok == eos_id:
                req.finish_reason = "eos"
                return
            req.output_ids.append(tok)
            req.text += decode([tok])
            hits = [s for s in req.stop if req.text.endswith(s)]
            if hits:
                s = pick(hits)
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                while strip_space and req.text.endswith(" "):
                    req.text = req.text[:-1]
                    req.output_ids.pop()
                req.finish_reason = "stop"
                return
            if len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"
                return
    return commit


def test_check_commit_sees_two_stop_strings_that_end_on_one_token():
    v = checks.check_commit(_commit(lambda hits: max(hits, key=len)))
    assert not v.passed and v.category == "stop_tie", v
    assert "'as' and ' was' both end on the same token" in v.message, v
    assert "the first of them in `req.stop`" in v.message and "rstrip" not in v.message, v
    v = checks.check_commit(_commit(lambda hits: min(hits, key=len)))
    assert not v.passed and v.category == "stop_tie", v
    assert "' frog' and 'og'" in v.message and "missed" not in v.message, v


def test_check_commit_sees_a_cut_that_strips_the_space_before_the_stop_string():
    v = checks.check_commit(_commit(lambda hits: hits[0], strip_space=True))
    assert not v.passed and v.category == "stripped_space", v
    assert "also the whitespace before it" in v.message and "rstrip" not in v.message, v


def test_check_commit_still_passes_the_engines_commit_on_the_new_run():
    assert checks.check_commit(_commit(lambda hits: hits[0])).passed
    assert checks.check_commit(lambda req, t, e, d: Request.commit(req, t, e, d)).passed


def test_check_commit_names_a_commit_that_lowers_the_limit():
    def lowers_limit(req, tokens, eos_id, decode):
        Request.commit(req, tokens, eos_id, decode)
        if req.finish_reason is None and len(req.output_ids) >= 8:
            req.max_new_tokens = len(req.output_ids)
    v = checks.check_commit(lowers_limit)
    assert not v.passed and v.category == "edits_requests", v
    assert "your commit changed prompt" in v.message and "`max_new_tokens`" in v.message, v
    assert "Set `req.finish_reason`" not in v.message, v


def _serial_then(after):
    """The serial loop, with ``after(engine, plan)`` once each round is processed."""
    def loop(engine):
        while engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))
            after(engine, plan)
    return loop


def _aborts_prompt_1(at):
    rounds = [0]

    def after(engine, plan):
        rounds[0] += 1
        req = engine.requests[1]
        if rounds[0] == at and not req.finished:
            engine.abort(req.id)
    return after


def test_loop_checks_name_a_request_the_loop_aborted():
    for check, loop in ((checks.check_serial_loop, _serial_then(_aborts_prompt_1(3))),
                        (checks.check_zos_loop, zos_loop(finish=_aborting_finish()))):
        v = check(loop)
        assert not v.passed and v.category == "edits_requests", (check.__name__, v)
        assert "your loop aborted prompt 1 itself" in v.message, v
        assert "the engine ended it" not in v.message and "free only" not in v.message, v


def _aborting_finish():
    calls = [0]

    def finish(eng, step):
        eng.process_outputs(step)
        calls[0] += 1
        if calls[0] == 3 and not eng.requests[1].finished:
            eng.abort(eng.requests[1].id)
    return finish


def _ends_prompt_3(engine, plan):
    for r in plan.requests:
        if r.index == 3 and len(r.output_ids) >= 5 and not r.finished:
            r.finish_reason = "length"


def test_serial_check_names_a_finish_reason_the_loop_set_without_freeing():
    v = checks.check_serial_loop(_serial_then(_ends_prompt_3))
    assert not v.passed and v.category == "edits_requests", v
    assert "prompt 3 had 5 of its 24 tokens when your loop ended it itself" in v.message, v
    assert "ended at its limit" not in v.message and "release_if_done" not in v.message, v


def _appends(engine, plan):
    for r in plan.requests:
        if r.finish_reason == "length" and not getattr(r, "_done", False):
            r.output_ids.append(r.output_ids[-1])
            r._done = True


def _replaces(engine, plan):
    for r in plan.requests:
        if r.finished and r.output_ids and not getattr(r, "_done", False):
            r.output_ids[-1] = r.output_ids[0] + 1
            r._done = True


def test_serial_check_names_tokens_the_loop_appended_or_replaced():
    for after, said in ((_appends, "your loop appended 1 token(s) to prompt 0's"),
                        (_replaces, "your loop changed prompt 0's token 23")):
        v = checks.check_serial_loop(_serial_then(after))
        assert not v.passed and v.category == "edits_requests", (after.__name__, v)
        assert said in v.message and not any(s in v.message for s in _STAGE_ORDER), v


def _zos_editing(edit):
    """The right ZOS loop, with ``edit(eng)`` each time it processes the held-back round."""
    def finish(eng, step):
        eng.process_outputs(step)
        edit(eng)
    return zos_loop(finish=finish)


def _lowers(eng):
    for r in eng.requests:
        r.max_new_tokens = min(r.max_new_tokens, 20)


def _ends_2(eng):
    r = eng.requests[2]
    if len(r.output_ids) >= 6 and not r.finished:
        r.finish_reason = "length"


def _pops(eng):
    for r in eng.requests:
        if r.finished and r.finish_reason != "abort" and not getattr(r, "_done", False):
            r.output_ids.pop()
            r._done = True


def _zos_then_appends(eng):
    loops_for_tests.zos_loop()(eng)
    for r in eng.requests:
        if r.finish_reason == "length":
            r.output_ids.append(r.output_ids[-1])


def test_zos_check_names_the_loops_edits_not_the_order():
    for loop, said in ((_zos_editing(_lowers), "`max_new_tokens` from 24 to 20"),
                       (_zos_editing(_ends_2), "when your loop ended it itself"),
                       (_zos_editing(_pops), "your loop removed tokens from prompt 0's `req.output_ids` (1 of them)"),
                       (_zos_then_appends, "your loop appended 1 token(s)")):
        v = checks.check_zos_loop(loop)
        assert not v.passed and v.category == "edits_requests", v
        assert said in v.message and not any(s in v.message for s in _STAGE_ORDER), v


def test_the_right_loops_still_pass():
    assert checks.check_serial_loop(loops_for_tests.serial_loop).passed
    assert checks.check_zos_loop(zos_loop()).passed


def _shipped_right(req):
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens


def lowers_limit(req):
    req.max_new_tokens = min(req.max_new_tokens, 10)
    return _shipped_right(req)


def ends_when_declining(req):
    wanted = _shipped_right(req)
    if not wanted and not req.finished:
        req.finish_reason = "length"
    return wanted


def test_check_wants_more_names_a_policy_that_changed_the_request():
    for policy, said in ((lowers_limit, "your policy changed prompt 0's `max_new_tokens`"),
                         (ends_when_declining, "when your policy ended it itself")):
        v = checks.check_wants_more(policy)
        assert not v.passed and v.category == "edits_requests", (policy.__name__, v)
        assert said in v.message and "must not change it" in v.message, v
    assert checks.check_wants_more(_shipped_right).passed
