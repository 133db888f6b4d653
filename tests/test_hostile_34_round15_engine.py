"""Round fifteen's engine cases (issue 34, round fourteen's 04 and 05): what a process_outputs
plug-in commits itself is checked as a per_request commit's is, and a ring exited out of order
is refused without leaving its setting behind."""

import contextvars
import warnings

import pytest

import toy_engine.engine as engine_module
from overlap_course.labs import plugins
from toy_engine.config import EngineConfig
from toy_engine.engine import Engine

PROMPTS = ["Once upon", "There was"]


@pytest.fixture(scope="module", params=["serial", "zos"])
def engine(request):
    with Engine(EngineConfig(mode=request.param, max_batch_size=2)) as eng:
        yield eng


def _committing_itself(convert):
    """A process_outputs plug-in that commits the round's tokens itself, storing convert(tok)."""
    def po(engine, step):
        engine.device.wait(step.sample_done)
        for req, tok in zip(step.plan.requests, engine.read_outputs(step)):
            req.num_inflight -= 1
            if req.finished:
                continue
            req.output_ids.append(convert(engine, int(tok)))
            req.text += engine.tokenizer.decode([int(tok)])
            if len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"
            engine.scheduler.release_if_done(req)
    return po


# ------------------------------------------------- 04: a process_outputs plug-in's own commit

@pytest.mark.parametrize("convert, got", [
    (lambda e, tok: e.tokenizer.decode([tok]), r"str '.*'"),
    (lambda e, tok: tok + e.tokenizer.vocab_size, r"int \d+"),
    (lambda e, tok: -1, r"int -1"),
    (lambda e, tok: float(tok), r"float \d+\.0"),
], ids=["decoded str", "past the vocabulary", "negative", "float"])
def test_a_process_outputs_plugin_storing_no_token_id_is_refused_when_it_returns(engine, convert,
                                                                                 got):
    """Before: `ValueError: too many dimensions 'str'` at the next prepare_inputs, or a
    DeviceError from the forward kernel, naming neither the plug-in nor output_ids."""
    reference = [c.text for c in engine.generate(PROMPTS, 8)]
    pid, vocab = engine.device.pid, engine.tokenizer.vocab_size
    with pytest.raises(TypeError, match=rf"^process_outputs=po, committing prompt 0's tokens "
                       rf"itself, stored {got} at req\.output_ids\[0\]: output_ids holds token "
                       rf"ids, ints from 0 to {vocab - 1} \(the vocabulary has {vocab}\)"):
        engine.generate(PROMPTS, 8, process_outputs=_committing_itself(convert))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no device replaced
        assert [c.text for c in engine.generate(PROMPTS, 8)] == reference
    assert engine.device.pid == pid


def test_a_process_outputs_plugin_committing_token_ids_runs_as_the_engines_own(engine):
    reference = [c.text for c in engine.generate(PROMPTS, 8)]
    out = engine.generate(PROMPTS, 8, process_outputs=_committing_itself(lambda e, tok: tok))
    assert [c.text for c in out] == reference


# ------------------------------------------------- 05: rings entered by hand, exited by hand

def _in_own_context(test):
    """Runs ``test`` in a copy of the context: a ring it leaves set does not reach other tests."""
    def run():
        contextvars.copy_context().run(test)
    run.__name__, run.__doc__ = test.__name__, test.__doc__
    return run


@_in_own_context
def test_a_ring_exited_before_one_entered_after_it_is_refused_and_changes_nothing():
    """Before: no error, and after both exits te.engine.RING_SLOTS stayed 3."""
    r3, r4 = plugins.ring(3), plugins.ring(4)
    r3.__enter__()
    r4.__enter__()
    with pytest.raises(RuntimeError, match=r"^ring\(3\) exited while ring\(4\), entered after it, "
                       r"is still entered; nothing was changed: exit ring\(4\) first, then "
                       r"ring\(3\)"):
        r3.__exit__(None, None, None)
    assert engine_module.RING_SLOTS.get() == 4
    r4.__exit__(None, None, None)  # as the message says
    assert engine_module.RING_SLOTS.get() == 3
    r3.__exit__(None, None, None)
    assert engine_module.RING_SLOTS.get() is None


@_in_own_context
def test_the_refusal_lists_every_ring_still_entered_innermost_first():
    r3, r4, r5 = plugins.ring(3), plugins.ring(4), plugins.ring(5)
    for r in (r3, r4, r5):
        r.__enter__()
    with pytest.raises(RuntimeError, match=r"ring\(5\), ring\(4\), entered after it, are still "
                       r"entered; nothing was changed: exit ring\(5\), then ring\(4\) first, "
                       r"then ring\(3\)"):
        r3.__exit__(None, None, None)
    for r in (r5, r4, r3):
        r.__exit__(None, None, None)
    assert engine_module.RING_SLOTS.get() is None


@_in_own_context
def test_a_ring_exited_again_is_refused_by_name():
    """Before: IndexError: pop from empty list (or AttributeError when never entered)."""
    three = plugins.ring(3)
    with three:
        pass
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"ring\(3\) is not entered in this thread"):
            three.__exit__(None, None, None)
    assert engine_module.RING_SLOTS.get() is None
