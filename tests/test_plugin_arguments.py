"""The labs' plug-ins check their arguments when built (issue 34): a typo, a request's field or
an ``at`` of the wrong shape is refused with a sentence naming the argument and what it must
be, not ignored or failing mid-run ("'int' object is not iterable")."""

import pytest

from overlap_course.checks import pool
from overlap_course.labs import plugins
from toy_engine.sequence import Request


def policy(req):
    return Request.wants_more(req)


def own_abort(engine, request_id):
    engine.abort(request_id)


@pytest.mark.parametrize("name, words", [
    ("wants_mor", r"a request has no method wants_mor \(did you mean wants_more\?\); its methods "
                  r"are commit, wants_more"),
    ("comit", r"did you mean commit\?"),
    ("nonsense", r"a request has no method nonsense; its methods are commit, wants_more"),
    ("finish_reason", r"finish_reason is a request's data, not a method"),
    ("output_ids", r"output_ids is a request's data, not a method"),
    ("finished", r"finished is a request's data, not a method"),
    ("num_inflight", r"num_inflight is a request's data, not a method"),
])
def test_per_request_refuses_names_that_are_not_a_requests_methods(name, words):
    with pytest.raises(TypeError, match=words):
        plugins.per_request(**{name: policy})


def test_per_request_refuses_a_method_that_is_not_a_function():
    with pytest.raises(TypeError, match="wants_more must be a function, got NoneType None"):
        plugins.per_request(wants_more=None)


@pytest.mark.parametrize("at, words", [
    (5, r"aborts: at must be a list of \(round, prompt index\) pairs, such as \[\(5, 1\)\], "
        r"got int 5"),
    ("51", r"aborts: at must be a list of .* got str '51'"),
    ([(1,)], r"aborts: at\[0\] must be a \(round, prompt index\) pair, got tuple \(1,\)"),
    ([(1, 0), 3], r"aborts: at\[1\] must be a \(round, prompt index\) pair, got int 3"),
    ([(1, 0, 2)], r"aborts: at\[0\] must be a \(round, prompt index\) pair"),
    ([("x", 0)], r"aborts: at\[0\]'s round must be an integer, got str 'x'"),
    ([(1, 0.5)], r"aborts: at\[0\]'s prompt index must be an integer, got float 0.5"),
    ([(True, 0)], r"aborts: at\[0\]'s round must be an integer, got the bool True"),
    ([(-1, 0)], r"aborts: at\[0\]'s round must be at least 0, got -1"),
    ([(1, -2)], r"aborts: at\[0\]'s prompt index must be at least 0, got -2"),
])
def test_aborts_refuses_an_at_of_the_wrong_shape_when_built(at, words):
    with pytest.raises((TypeError, ValueError), match=words):
        plugins.aborts(own_abort, at)


@pytest.mark.parametrize("slots, error, words", [
    (0, ValueError, r"slots must be in \[1, 8\], got 0"),
    ("3", TypeError, r"slots must be an integer, got str '3'"),
])
def test_ring_refuses_a_size_it_cannot_run(slots, error, words):
    with pytest.raises(error, match=words), plugins.ring(slots):
        pass


def test_the_right_arguments_still_run_and_an_at_may_be_any_iterable():
    """A generator ``at`` is read once when built (it was used up by the first round), and a
    request's own method replaced through ``per_request`` is still called."""
    engine = pool.engine()
    outs = engine.generate(pool.PROMPTS, max_new_tokens=8,
                           on_round=plugins.aborts(own_abort, ((r, 1) for r in [3])))
    assert [c.finish_reason for c in outs].count("abort") == 1 and outs[1].finish_reason == "abort"
    asked = []

    def spy(req):
        asked.append(req.index)
        return Request.wants_more(req)  # the request's own, which spy now stands in for
    outs = engine.generate(pool.PROMPTS, max_new_tokens=4,
                           on_round=plugins.per_request(wants_more=spy))
    assert {c.finish_reason for c in outs} == {"length"}
    assert set(asked) == set(range(len(pool.PROMPTS)))


def test_the_engine_and_the_plugins_share_one_check_of_functions():
    with pytest.raises(TypeError, match="on_round must be a function or None, got int 5"):
        pool.engine().generate(pool.PROMPTS, on_round=5)
    with pytest.raises(TypeError, match="abort must be a function, got NoneType None"):
        plugins.aborts(None, [(1, 0)])
