"""Issue 34, round thirty-six, engine.  Naming what a heavy plug-in carries looked into a
function of an imported module (pickled by its name: nothing it reads travels), so a learner's
own ``helpers.py`` table was named first, or alone; it named a global ``torch.nn.Module`` by its
``._parameters``, and nothing for a class attribute or a global read by a class's
``__call__``.  And a plug-in under a ``functools.wraps`` decorator passed the argument check
(``inspect.signature`` follows ``__wrapped__``) and failed at its first call with Python's bare
"takes 1 positional argument but 2 were given"."""

from __future__ import annotations

import functools
import textwrap

import pytest

import toy_engine as te
from toy_engine.sending import NotSendable

PROMPTS = ["Once upon", "The cat"]

# A notebook's cells (``__main__``: sent by value), carrying what each name says
CELLS = '''
import torch
from toy_engine import kernels
from heavy_helpers_r36 import shift

MINE = torch.zeros(2_700_000)  # 10.8 MB
NET = torch.nn.Linear(2000, 2000)  # 16 MB, a callable object
TABLE = torch.zeros(3_000_000)  # 12 MB

def calls_a_module_helper(meta, accepted, block_size):
    MINE.shape
    meta["seqlens_k"] = shift(meta["seqlens_k"])
    kernels.correct_seqlens_qk(meta, accepted, block_size)

def uses_net(meta, accepted, block_size):
    NET.weight.shape
    kernels.correct_seqlens_qk(meta, accepted, block_size)

class WithClassTable:
    TABLE2 = torch.zeros(4_000_000)  # 16 MB
    def __call__(self, meta, accepted, block_size):
        self.TABLE2.shape
        kernels.correct_seqlens_qk(meta, accepted, block_size)

class ReadsGlobal:
    def __call__(self, meta, accepted, block_size):
        TABLE.shape
        kernels.correct_seqlens_qk(meta, accepted, block_size)
'''


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    folder = tmp_path_factory.mktemp("helpers")
    (folder / "heavy_helpers_r36.py").write_text(textwrap.dedent('''
        import torch
        BIG = torch.zeros(10_000_000)  # 40 MB, stays in this module
        def shift(t):
            return t + BIG[0].to(t.dtype)
    '''))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        space = {"__name__": "__main__"}
        exec(compile(CELLS, "<cell>", "exec"), space)
        yield space


@pytest.mark.parametrize("name, named", [
    ("calls_a_module_helper", "global `MINE` (10.8 MB))"),  # before: `BIG` (40.0 MB) first
    ("uses_net", "global `NET` (16.0 MB))"),  # before: attribute `._parameters`
    ("WithClassTable", "class attribute `.TABLE2` (16.0 MB))"),  # before: nothing named
    ("ReadsGlobal", "global `TABLE` (12.0 MB))"),  # before: nothing named
])
def test_a_heavy_plug_in_is_named_by_what_travels(cells, name, named):
    plugin = cells[name]() if isinstance(cells[name], type) else cells[name]
    with te.Engine(te.EngineConfig(mode="zos", num_draft_tokens=2)) as engine:
        with pytest.raises(NotSendable) as raised:
            engine.generate(PROMPTS, max_new_tokens=8, correction=plugin)
    said = str(raised.value)
    assert f"with what it reads: {named}" in said and "BIG" not in said, said


def _wrapped(function):
    @functools.wraps(function)
    def wrapper(engine):  # a decorator's wrapper that takes one argument: the run gives more
        return function(engine)
    return wrapper


@_wrapped
def on_round(engine, round):
    pass


@_wrapped
def process(engine, step):
    engine.process_outputs(step)


@pytest.mark.parametrize("plugin, call", [
    ({"on_round": on_round}, "on_round(engine, round), and on_round(engine)"),
    ({"process_outputs": process}, "process_outputs(engine, step), and process(engine)"),
])
def test_a_decorators_wrapper_is_checked_before_the_run(plugin, call):
    """Before: ``TypeError: on_round() takes 1 positional argument but 2 were given``."""
    with te.Engine(te.EngineConfig(mode="zos")) as engine:
        with pytest.raises(TypeError) as raised:
            engine.generate(PROMPTS, max_new_tokens=4, **plugin)
        said = str(raised.value)
        assert f"the run calls it as {call} (the wrapper a decorator put around" in said, said
        assert engine.requests == [] or all(r.finish_reason for r in engine.requests)
        assert len(engine.generate(PROMPTS, max_new_tokens=4)) == 2
