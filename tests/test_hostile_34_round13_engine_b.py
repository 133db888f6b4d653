"""Issue 34's thirteenth hostile round, area `engine`, fixer `engine13b`: a dead forkserver
taken for a dead device (06), a ring reused (07), a request's completion replaced (08), lazy
iterators from plug-ins (09), stages given a finished run's objects (11), a config change
refused for a false reason (12), and a correction that can never run (14)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine import engine as engine_module
from toy_engine import run, sequence
from loops_for_tests import zos_loop

PROMPTS = ["Once upon", "The cat", "A dog"]


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)) as eng:
        yield eng


def _usable(eng):
    """The engine runs right after the refusal."""
    out = eng.generate(["Once upon"], max_new_tokens=5)
    assert out[0].finish_reason == "length" and len(out[0].token_ids) == 5


# ------------------------------------------------------------------ 06: a dead forkserver

_FORKSERVER_KILLED = textwrap.dedent('''
    import os, signal, time, warnings, multiprocessing.forkserver as fs
    import toy_engine as te

    def run(e):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            text = e.generate("Once upon", max_new_tokens=4)[0].text
        return text, [str(x.message) for x in w]

    e = te.Engine(te.EngineConfig(mode="zos", max_batch_size=2))
    reference, _ = run(e)
    os.kill(fs._forkserver._forkserver_pid, signal.SIGKILL)
    time.sleep(0.3)
    device = e.device.pid
    text, warned = run(e)
    print("kept", e.device.pid == device, text == reference, warned)
    os.kill(device, signal.SIGKILL)   # the device as well, the forkserver still gone
    time.sleep(0.3)
    text, warned = run(e)
    print("replaced", e.device.pid != device, text == reference, warned)
    other = te.Engine(te.EngineConfig(mode="zos", max_batch_size=2))   # a new forkserver
    print("new", run(other)[0] == reference)
''')


@pytest.mark.timeout(300)
def test_06_a_dead_forkserver_keeps_the_live_device_and_no_message_says_code_255():
    """Before: the live device was replaced with the warning "the device process exited with
    code 255" (the forkserver's answer once it is gone), and its death later said code 255."""
    child = subprocess.run([sys.executable, "-c", _FORKSERVER_KILLED], capture_output=True,
                           text=True, timeout=240, env={**os.environ, "PYTHONPATH": os.getcwd()})
    lines = child.stdout.splitlines()
    assert child.returncode == 0 and len(lines) == 3, child.stdout + child.stderr[-2000:]
    assert lines[0] == "kept True True []", lines[0]
    assert lines[1].startswith("replaced True True ['the device process ended after the "
                               "forkserver that started it, which reports how, was gone;"), lines[1]
    assert "255" not in lines[1], lines[1]
    assert lines[2] == "new True", lines[2]


# ------------------------------------------------------------------ 07: a ring kept and reused

def test_07_a_ring_kept_in_a_variable_can_be_entered_again_nested_and_per_thread():
    """Before: the second `with three:` raised AttributeError '_GeneratorContextManager' object
    has no attribute 'args' (a generator context manager is used once)."""
    three = plugins.ring(3)
    assert repr(three) == "ring(3)"
    for _ in range(2):  # the cell run again
        with three:
            assert engine_module.RING_SLOTS.get() == 3
            with plugins.ring(5), three:
                assert engine_module.RING_SLOTS.get() == 3
            assert engine_module.RING_SLOTS.get() == 3
        assert engine_module.RING_SLOTS.get() is None
    seen, inside = [], threading.Barrier(2)

    def cell():
        with three:
            inside.wait(10)
            seen.append(engine_module.RING_SLOTS.get())
            inside.wait(10)
        seen.append(engine_module.RING_SLOTS.get())
    threads = [threading.Thread(target=cell) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [3, 3, None, None]
    with pytest.raises(ValueError, match="slots must be in"):
        plugins.ring(0)


# ------------------------------------------------------------------ 08: req.completion replaced

def _replaces_completion(f):
    def on_round(eng, round):
        if round == 1:
            for req in eng.requests:
                req.completion = f
    return on_round


def test_08_a_request_completion_cannot_be_replaced_and_every_observer_hears_end(engine):
    """Before: a plug-in's req.completion ran where Ctrl-C is held (a 3 s one delayed it 5 s),
    its 'junk' answer became engine.completions, and one that raised left the last run's
    completions and stats and told RUN_OBSERVERS "start" without "end"."""
    phases = []
    engine_module.RUN_OBSERVERS.append(lambda eng, phase: phases.append(phase))
    try:
        before = engine.generate(PROMPTS, max_new_tokens=3)
        stats = engine.stats
        with pytest.raises(AttributeError, match=r"req\.completion cannot be replaced \(prompt "
                                                 r"0\): the engine calls it as the run ends"):
            engine.generate(["A dog", "She said"], max_new_tokens=8,
                            on_round=_replaces_completion(lambda: "junk"))
    finally:
        engine_module.RUN_OBSERVERS.pop()
    assert phases == ["start", "end", "start", "end"]
    assert all(isinstance(c, te.Completion) for c in engine.completions)
    assert engine.completions != before and engine.stats is not stats
    assert [c.prompt for c in engine.completions] == ["A dog", "She said"]
    assert [c.finish_reason for c in engine.completions] == ["abort", "abort"]
    req = engine.requests[0]
    with pytest.raises(AttributeError, match="cannot be replaced"):
        object.__setattr__(req, "completion", lambda: "junk")
    vars(req)["completion"] = lambda: "junk"  # the class's own is what runs, even then
    assert isinstance(req.completion(), te.Completion)
    _usable(engine)


def test_08_a_completion_that_raises_still_ends_the_run_for_its_observers(engine, monkeypatch):
    phases = []
    monkeypatch.setattr(engine_module, "RUN_OBSERVERS", [lambda eng, p: phases.append(p)])

    def breaks_output_ids(eng, round):
        if round == 1:
            eng.requests[0].output_ids = None  # vandalism: not a list
    with pytest.raises(TypeError):
        engine.generate(PROMPTS, max_new_tokens=4, on_round=breaks_output_ids)
    # Round 17: completion() copies only a plain list (no object's code runs where Ctrl-C is
    # held), so a completion is made to raise here by its Completion.
    assert phases == ["start", "end"] and engine.completions[0].token_ids == []

    def broken(*args):
        raise RuntimeError("a completion that raises")
    phases.clear()
    with monkeypatch.context() as patched:
        patched.setattr(sequence, "Completion", broken)
        with pytest.raises(RuntimeError, match="a completion that raises"):
            engine.generate(PROMPTS, max_new_tokens=4)
    assert phases == ["start", "end"] and engine.completions == [] and engine.stats is None
    _usable(engine)


# ------------------------------------------------------------------ 09: lazy iterators

@pytest.mark.parametrize("make", [
    lambda eng: map(eng.abort, [eng.requests[0].id]),
    lambda eng: filter(eng.abort, [eng.requests[0].id]),
    lambda eng: itertools.starmap(eng.abort, [(eng.requests[0].id,)]),
    lambda eng: zip(map(eng.abort, [eng.requests[0].id])),
], ids=["map", "filter", "starmap", "zip"])
def test_09_a_plugin_answering_a_lazy_iterator_is_refused_by_name(engine, make):
    """Before: map/filter/starmap answers were ignored: nothing was aborted, no error."""
    with pytest.raises(TypeError, match=r"on_round=<lambda> returned a lazy iterator \(\w+\) "
                                        r"that nothing iterates"):
        engine.generate(PROMPTS, max_new_tokens=10,
                        on_round=lambda eng, r: make(eng) if r == 3 else None)
    with pytest.raises(TypeError, match=r"aborts: abort=<lambda> returned a lazy iterator"):
        engine.generate(PROMPTS, max_new_tokens=10, on_round=plugins.aborts(
            lambda eng, rid: map(eng.abort, [rid]), [(3, 0)]))
    _usable(engine)


def test_09_an_iterator_over_what_already_ran_is_not_refused(engine):
    """Round 39: the work of ``iter([eng.abort(...)])`` happened: refused as "calls that never
    happened", a loop's finished run was lost."""
    out = engine.generate(PROMPTS, max_new_tokens=10, on_round=lambda eng, r: iter(
        [eng.abort(eng.requests[0].id)]) if r == 3 else None)
    assert out[0].finish_reason == "abort"


def test_09_a_plugin_answering_a_list_or_none_still_runs(engine):
    out = engine.generate(PROMPTS, max_new_tokens=10, on_round=lambda eng, r: list(
        map(eng.abort, [eng.requests[0].id])) if r == 3 else None)
    assert [c.finish_reason for c in out] == ["abort", "length", "length"]


# ------------------------------------------------------------------ 11: after the run

def _keeping_loop(kept):
    return zos_loop(seen=lambda inputs, step: kept.update(inputs=inputs, step=step))


def test_11_stages_refuse_the_objects_of_a_run_that_has_ended(engine):
    """Before: launch_sample and correct_on_device launched device work for the ended run, and
    process_outputs of its kept step said to "wait on an event ... first"."""
    kept = {}
    reference = [c.text for c in engine.generate(PROMPTS, max_new_tokens=10)]
    assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=10,
                                            loop=_keeping_loop(kept))] == reference
    events = len(engine.record.events)
    for name in ("correct_on_device", "launch_forward", "launch_sample"):
        with pytest.raises(run.RunEnded, match=rf"{name} was given round \d+'s inputs of a run "
                                               rf"that has ended .* call engine\.generate"):
            getattr(engine, name)(kept["inputs"])
    for name in ("process_outputs", "flush", "read_outputs"):
        with pytest.raises(run.RunEnded, match=rf"{name} was given round \d+'s step of a run "
                                               rf"that has ended"):
            getattr(engine, name)(kept["step"])
    with pytest.raises(run.RunEnded, match="commit_outputs was given"):
        engine.commit_outputs(kept["step"], [])
    assert len(engine.record.events) == events  # nothing launched, waited or committed
    _usable(engine)
    with pytest.raises(run.ForeignStep):  # a later run's stages: another run's step, as before
        engine.generate(PROMPTS, max_new_tokens=4,
                        loop=lambda eng: eng.process_outputs(kept["step"]))


# ------------------------------------------------------------------ 12: config between runs

def test_12_what_a_run_reads_afresh_may_change_between_runs_and_the_rest_says_why(engine):
    """Before: mode, seed and host_overhead_ms were refused "because its buffers, cache and
    device were sized from the first", which is false for them."""
    from toy_engine import config as config_module
    fields = {f.name for f in dataclasses.fields(te.EngineConfig)}
    assert fields == set(config_module.PER_RUN) | set(config_module.BUILT_FROM)
    built, sampled = engine.config, dict(temperature=0.9, max_new_tokens=10)
    def texts(outs):
        return [(c.text, c.token_ids, c.finish_reason) for c in outs]
    reference = texts(engine.generate(PROMPTS, max_new_tokens=10))
    try:
        engine.config = dataclasses.replace(built, mode="serial", host_overhead_ms=1.0)
        assert texts(engine.generate(PROMPTS, max_new_tokens=10)) == reference
        assert engine.timeline.meta.mode == "serial" and engine.timeline.meta.host_overhead_ms == 1
        engine.config = dataclasses.replace(built, seed=7)
        seven = texts(engine.generate(PROMPTS, **sampled))
        assert seven == texts(engine.generate(PROMPTS, seed=7, **sampled))
        assert seven != texts(engine.generate(PROMPTS, seed=0, **sampled))
        engine.config = dataclasses.replace(built, block_size=8, race_check=False)
        with pytest.raises(ValueError) as err:
            engine.generate(PROMPTS, max_new_tokens=3)
        message = str(err.value)
        assert "sized from the first" not in message
        assert ("(block_size=8, race_check=False), but the engine was built from those values "
                "(block_size: its KV cache and block tables are laid out in blocks of that size; "
                "race_check: its device's race checker was set up with it)") in message, message
    finally:
        engine.config = built
    assert texts(engine.generate(PROMPTS, max_new_tokens=10)) == reference
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"between runs, set engine\.config "
                       r"= dataclasses\.replace\(engine\.config, seed=3\) \(a run reads seed"):
        built.seed = 3
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"the engine was built from it"):
        built.block_size = 8


# ------------------------------------------------------------------ 14: a correction never called

def _broken(meta, accepted, block_size):
    raise RuntimeError("my correction ran")


@pytest.mark.parametrize("config, why", [
    (dict(mode="zos"), r"this engine has no drafts \(num_draft_tokens=0\)"),
    (dict(mode="serial", num_draft_tokens=2), r"the serial loop \(mode='serial'\) processes "
                                              r"each round before preparing the next"),
    (dict(mode="zos", num_draft_tokens=2, correct_seqlens=False),
     r"correct_seqlens=False turns the correction off"),
])
def test_14_a_correction_that_can_never_run_is_refused_with_why(config, why):
    """Before: the correction was taken and never called: a broken one "worked"."""
    with te.Engine(te.EngineConfig(max_batch_size=2, **config)) as eng:
        with pytest.raises(ValueError, match=rf"correction=_broken would never be called: {why}"):
            eng.generate(PROMPTS[:2], max_new_tokens=8, correction=_broken)
        _usable(eng)


def test_14_a_correction_runs_where_it_can():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=2, num_draft_tokens=2)) as eng:
        with pytest.raises(te.DeviceError, match="my correction ran"):
            eng.generate(PROMPTS[:2], max_new_tokens=8, correction=_broken)
        serial = dataclasses.replace(eng.config, mode="serial")
        eng.config = serial
        from toy_engine import loops
        with pytest.raises(te.DeviceError, match="my correction ran"):  # its own loop: it may
            eng.generate(PROMPTS[:2], max_new_tokens=8, correction=_broken, loop=loops.zos_loop)


# ------------------------------------------------------------------ the tokens stay the same

@pytest.mark.timeout(300)
def test_greedy_tokens_are_the_same_serial_zos_and_speculative():
    outs = []
    for config in (dict(mode="serial"), dict(mode="zos"), dict(mode="zos", num_draft_tokens=2)):
        with te.Engine(te.EngineConfig(max_batch_size=3, **config)) as eng:
            outs.append([c.token_ids for c in eng.generate(PROMPTS + ["She said"],
                                                           max_new_tokens=24)])
    assert outs[0] == outs[1] == outs[2]
