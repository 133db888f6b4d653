"""Round sixteen's third blind round (issue 34): exercise 02's and 03's loop checks compare the
completions (text, finish reason) and the rounds' plans with the reference's, and name a loop's
edits to the requests; notebook 07's check_commit sees later stop strings, a string cut and two
stops completing in one accepted run."""

import toy_engine as te
from overlap_course import checks
import loops_for_tests


def _serial(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def blanks_text(engine):
    _serial(engine)
    for r in engine.requests:
        r.text, r.finish_reason = "", "stop"


def uppercases_text(engine):
    _serial(engine)
    for r in engine.requests:
        r.text = r.text.upper()


def reverses_queue(engine):
    engine.scheduler.waiting.reverse()
    _serial(engine)


def lowers_limit(engine):
    for r in engine.requests:
        r.max_new_tokens = min(r.max_new_tokens, 8)
    _serial(engine)


def pops_a_token(engine):
    _serial(engine)
    for r in engine.requests:
        r.output_ids.pop()


def ends_requests(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
        for r in list(engine.requests):
            if len(r.output_ids) >= 8 and not r.finished:
                r.finish_reason = "length"
                engine.scheduler.release_if_done(r)


def zos_blanks_text(engine):
    loops_for_tests.zos_loop()(engine)
    for r in engine.requests:
        r.text = ""


def test_a_loop_that_rewrites_the_completions_fails_naming_them():
    for loop in (blanks_text, uppercases_text):
        v = checks.check_serial_loop(loop)
        assert not v.passed and v.category == "edits_run", v
        assert "text" in v.message and "must not change them" in v.message
    v = checks.check_zos_loop(zos_blanks_text)
    assert not v.passed and v.category == "edits_run" and "text ''" in v.message, v


def test_a_loop_that_reorders_the_queue_fails_and_a_pass_says_whose_counts():
    v = checks.check_serial_loop(reverses_queue)
    assert not v.passed and v.category == "edits_run", v
    assert "engine.scheduler.waiting" in v.message and "first come, first served" in v.message
    right = checks.check_serial_loop(loops_for_tests.serial_loop)
    assert right.passed and "your serial loop's runs are the reference's" in right.message


def test_a_loop_that_edits_the_requests_is_told_so_not_the_stage_order():
    for loop, said in ((lowers_limit, "`max_new_tokens` from 24 to 8"),
                       (pops_a_token, "removed tokens"), (ends_requests, "ended it itself")):
        v = checks.check_serial_loop(loop)
        assert not v.passed and v.category == "edits_requests", (loop.__name__, v)
        assert said in v.message and "launch sample, then process" not in v.message, v


def _commit(cut):
    """A commit as the engine's, but ``cut(req)`` decides where a stop string ends the text."""
    def commit(req, tokens, eos_id, decode):
        for tok in tokens:
            if tok == eos_id:
                req.finish_reason = "eos"
                return
            req.output_ids.append(tok)
            req.text += decode([tok])
            if cut(req):
                req.finish_reason = "stop"
                return
            if len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"
                return
    return commit


def _first_stop_only(req):
    s = req.stop[0]
    if req.text.endswith(s):
        req.text = req.text[: -len(s)]
        del req.output_ids[len(req.output_ids) - len(s):]
        return True
    return False


def _rstrip(req):
    for s in req.stop:
        if req.text.endswith(s):
            req.text = req.text.rstrip(s)
            del req.output_ids[len(req.text):]
            return True
    return False


def list_order(req, tokens, eos_id, decode):
    """The whole run appended, cut at the limit, then at the first stop in list order."""
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            break
        req.output_ids.append(tok)
        req.text += decode([tok])
    if len(req.output_ids) >= req.max_new_tokens:
        del req.output_ids[req.max_new_tokens:]
        req.text = decode(req.output_ids)
        req.finish_reason = req.finish_reason or "length"
    for s in req.stop:
        i = req.text.find(s)
        if i >= 0:
            req.text, req.finish_reason = req.text[:i], "stop"
            del req.output_ids[i:]
            return


def test_check_commit_sees_a_later_stop_a_string_cut_and_two_stops_in_one_run():
    v = checks.check_commit(_commit(_first_stop_only))
    assert not v.passed and "' was'" in v.message and "whatever its place" in v.message, v
    v = checks.check_commit(_commit(_rstrip))
    assert not v.passed and "str.rstrip" in v.message and "' cam'" in v.message, v
    v = checks.check_commit(list_order)
    assert not v.passed and "whatever its place in the list" in v.message, v


def test_check_commit_still_passes_the_engines_commit():
    from toy_engine.sequence import Request
    assert checks.check_commit(lambda req, t, e, d: Request.commit(req, t, e, d)).passed
