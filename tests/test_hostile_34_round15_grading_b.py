"""Issue 34, round fifteen, grading (b).  A cell that patched ``torch.nn.Module.eval`` (torch
code the fingerprint does not watch) edited the model the check loads again after the judge
empties its caches, the edited weights reached the device, and a wrong loop matched its own
reference: full marks.  A wrong loop that edited ``pool.reference()``'s cached lists in place to
its own tokens passed too.  And two right answers were failed: torch registers a reducer for
sympy's ``UndefinedFunction`` in the picklers' table as ``torch.profiler`` or ``torch.compile``
first runs, and ``help(te.Engine)`` makes Python 3.11 add an empty ``__annotations__`` to the
class: both read as the submission's change.  Each failed when written."""

from __future__ import annotations

import copyreg
import pydoc

import pytest
import torch

import toy_engine as te
import toy_engine.process_device  # noqa: F401 - the picklers' tables, as the judge reads them
from overlap_course.build import judge
from overlap_course.build.judge_fingerprint import _compare, _fingerprint
from overlap_course.checks import pool
from overlap_course import device_state

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

# Every TinyGPT put in eval mode predicts token 5, as the wrong loop writes: the reference too.
_FORCES_FIVE = '''
import torch
_eval = torch.nn.Module.eval
def _forced(self):
    out = _eval(self)
    if type(self).__name__ == "TinyGPT":
        with torch.no_grad():
            W = self.tok_emb.weight
            want = torch.zeros(W.shape[0], dtype=W.dtype)
            want[5] = 50.0
            self.ln_f.weight.zero_()
            self.ln_f.bias.copy_(torch.linalg.lstsq(W, want.unsqueeze(1)).solution.squeeze(1))
    return out
torch.nn.Module.eval = _forced
'''


def test_a_model_changed_on_its_way_to_the_device_fails_the_check_in_the_judge():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, _FORCES_FIVE])
    assert passed is False, message


def test_an_engine_whose_device_got_other_weights_is_refused_as_it_is_built(monkeypatch):
    """The checks verify each new device by value against the shipped model read at import,
    whatever torch code the model went through (here ``Module.eval``, patched)."""
    monkeypatch.setattr(torch.nn.Module, "eval", torch.nn.Module.eval)  # put back by undo
    exec(_FORCES_FIVE, {})
    pool.close_engines()
    pool._model.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="not built as shipped"):
            pool.engine()
    finally:
        monkeypatch.undo()
        pool._model.cache_clear()
        pool.close_engines()
    assert pool.engine() is not None  # the shipped model again: built, verified


def test_the_models_digest_reads_its_settings_as_well_as_its_weights():
    """A setting no weight holds (a block's ``n_head``, a ``forward`` set on a module) changes
    what the device computes: it changes the digest too."""
    model, _ = te.load_model()
    first = device_state.model_print(model)
    model.blocks[0].n_head = 2
    second = device_state.model_print(model)
    model.blocks[0].n_head = 4
    model.ln_f.forward = lambda x: x
    assert len({first, second, device_state.model_print(model)}) == 3


def test_a_patched_cloudpickle_is_a_change(monkeypatch):
    """What the device gets (the model, each kernel, the verification) goes through it."""
    import cloudpickle
    before = _fingerprint()
    monkeypatch.setattr(cloudpickle, "dumps", lambda *a, **k: b"")
    assert "cloudpickle.dumps" in _compare(before, _fingerprint())


def test_a_wrong_loop_that_edits_the_cached_references_does_not_pass():
    needs_the_engine()
    edits = WRONG_LOOP + '''
    from overlap_course.checks import pool
    if len(engine.requests) == 4:
        second = engine.requests[0].max_new_tokens == 16
        ref = pool.reference(second=True) if second else pool.reference()
        for row, req in zip(ref, sorted(engine.requests, key=lambda r: r.index)):
            row[:] = list(req.output_ids)
'''
    passed, message = judge.judge("check_serial_loop", [IMPORTS, edits])
    assert passed is False, message


def test_the_references_cannot_be_changed_in_place():
    """Those of the graded checks (exercises 02 to 05), which the learner's code can call."""
    from overlap_course.checks import lesson02, lifetime_runs
    ends = lifetime_runs.completions(lifetime_runs.RUNS[0])
    for ref in (pool.reference(), pool.reference(second=True), lesson02._long_reference(),
                [e.token_ids for e in pool.endings_reference()], [e.token_ids for e in ends]):
        with pytest.raises(TypeError):
            ref[0][0] = 5
    with pytest.raises(AttributeError):
        pool.endings_reference()[0].token_ids = [5]


def test_a_reducer_for_a_type_the_checker_never_sends_is_not_a_change(monkeypatch):
    """As torch registers for sympy's ``UndefinedFunction``; one for a type the engine sends
    (a toy's, torch's) still is."""
    before = _fingerprint()
    foreign = type("UndefinedFunction", (), {"__module__": "sympy.core.function"})
    monkeypatch.setitem(copyreg.dispatch_table, foreign, lambda x: (foreign, ()))
    assert _compare(before, _fingerprint()) == []
    monkeypatch.setitem(copyreg.dispatch_table, te.EngineConfig, lambda x: (dict, ()))
    assert _compare(before, _fingerprint()) != []


@pytest.fixture
def engine_without_annotations():
    te.Engine.__annotations__  # noqa: B018 - made now if it was not there (Python 3.11)
    kept = te.Engine.__annotations__
    del te.Engine.__annotations__
    yield te.Engine
    te.Engine.__annotations__ = kept


def test_an_empty_annotations_python_adds_as_help_reads_a_class_is_not_a_change(
        engine_without_annotations):
    before = _fingerprint()
    pydoc.render_doc(engine_without_annotations)
    assert _compare(before, _fingerprint()) == []
    engine_without_annotations.__annotations__["added"] = int  # one that holds names is
    assert any("Engine.__dict__" in key for key in _compare(before, _fingerprint()))


@pytest.mark.parametrize("cell", ["import torch\nwith torch.profiler.profile():\n"
                                  "    torch.ones(3) + 1\n", "help(te.Engine)\n"])
def test_a_right_loop_below_an_ordinary_cell_passes_in_the_judge(cell):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell, RIGHT_LOOP])
    assert passed is True, message
