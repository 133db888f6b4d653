"""Round eighteen's blind round (issue 34): notebook 07's check_commit names a commit's edit of
a request setting that the engine refuses after the commit returned (it said "your commit raised
ValueError", though the commit raised nothing); exercise 02's check_serial_loop names a token the
loop removed (it blamed the scheduler's queues), and both loop checks name a finish reason the
loop reset to None (serial said "your loop let it go", ZOS passed)."""

from overlap_course import checks
from toy_engine.sequence import Request

from loops_for_tests import zos_loop

_FIX = "a loop must not edit the requests"


def _edits_then_commits(edit):
    """A right commit that first does ``edit(req)`` to the request's settings."""
    def commit(req, tokens, eos_id, decode):
        edit(req)
        Request.commit(req, tokens, eos_id, decode)
    return commit


def _setting(name, value):
    return lambda req: setattr(req, name, value(req))


def test_check_commit_names_a_settings_edit_the_engine_refused_after_it_returned():
    edits = {"stop": _setting("stop", lambda r: tuple(reversed(r.stop))),
             "stop ": _setting("stop", lambda r: ()),
             "stop  ": _setting("stop", lambda r: list(r.stop)),
             "temperature": _setting("temperature", lambda r: 0.5),
             "max_new_tokens": _setting("max_new_tokens", lambda r: r.max_new_tokens + 1)}
    for field, edit in edits.items():
        v = checks.check_commit(_edits_then_commits(edit))
        assert not v.passed and v.category == "edits_requests", (field, v)
        assert f"your commit changed prompt 0's `{field.strip()}` from" in v.message, v
        assert "raised" not in v.message and "must not change its settings" in v.message, v


def test_check_commit_still_says_raised_when_the_commit_raised_after_an_edit():
    def edits_then_raises(req, tokens, eos_id, decode):
        req.stop = ()
        raise ValueError("mine")
    v = checks.check_commit(edits_then_raises)
    assert not v.passed and v.category == "raised" and "ValueError: mine" in v.message, v


def _serial_then(after):
    """The serial loop, with ``after(plan, k)`` once round ``k`` (from 1) is processed."""
    def loop(engine):
        k = 0
        while engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))
            k += 1
            after(plan, k)
    return loop


def _pop_at(k, i=0):
    def after(plan, round):
        if round == k and len(plan.requests) > i and plan.requests[i].output_ids:
            plan.requests[i].output_ids.pop()
    return after


def _del_at_ten():
    """``after(plan, ...)``: deletes the last token of each request that reaches 10, once."""
    done = set()

    def after(plan, *_):
        for r in plan.requests:
            if len(r.output_ids) == 10 and r.id not in done:
                del r.output_ids[-1]
                done.add(r.id)
    return after


def test_check_serial_loop_names_a_removed_token_not_the_scheduler():
    for name, after in (("pop in round 4", _pop_at(4)), ("pop in round 2, request 1",
                                                        _pop_at(2, 1)), ("del", _del_at_ten())):
        v = checks.check_serial_loop(_serial_then(after))
        assert not v.passed, (name, v)
        assert "removed tokens from prompt" in v.message and _FIX in v.message, (name, v)
        assert "scheduler" not in v.message, (name, v)


def _reopens_once():
    """``after(plan, ...)``: sets finish_reason None on the first request it sees ended "stop"."""
    state = {"done": False}

    def after(plan, *_):
        for r in plan.requests:
            if r.finish_reason == "stop" and not state["done"]:
                r.finish_reason, state["done"] = None, True
    return after


def _zos_then(after):
    """The right ZOS loop with ``after(plan)`` once each round's sample is launched."""
    return zos_loop(seen=lambda inputs, step: after(inputs.plan))


_REOPENED = "changed prompt 2's `req.finish_reason` from 'stop' to None"


def test_check_serial_loop_names_a_finish_reason_reset_to_none_not_a_free():
    v = checks.check_serial_loop(_serial_then(_reopens_once()))
    assert not v.passed and v.category == "edits_requests", v
    assert _REOPENED in v.message and _FIX in v.message and "let it go" not in v.message, v


def test_check_zos_loop_fails_a_finish_reason_reset_to_none_naming_it():
    v = checks.check_zos_loop(_zos_then(_reopens_once()))
    assert not v.passed and _REOPENED in v.message and _FIX in v.message, v
