"""Issue 34's sixth hostile round, the engine and the plug-ins: a Ctrl-C while an engine starts
its device process, or while a plug-in is pickled; a plug-in's answer or a config's choice that
lies in its comparisons; a wrong answer that changes the checkers' shared engine in place, and a
check called from inside a check's run.  Each failed when written (round six)."""

from __future__ import annotations

import textwrap

import pytest

import toy_engine as te
from hostile_support import run_python
from overlap_course import checks
from overlap_course.checks import sandbox
from overlap_course.labs import plugins, plugins_2026
from toy_engine import process_device
import loops_for_tests


class LiesInt(int):
    """An int whose comparisons all say "in range"."""

    def __le__(self, other): return True
    def __ge__(self, other): return True
    def __lt__(self, other): return True
    def __gt__(self, other): return False
    __hash__ = int.__hash__


class IntDiffers(int):
    """An int whose ``int()`` is not the value it compares as."""

    def __int__(self): return 7
    def __index__(self): return 7


class LiesStr(str):
    """A str equal to everything."""

    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = str.__hash__


@pytest.mark.skipif(process_device.start_method() != "forkserver", reason="needs the forkserver")
def test_ctrl_c_while_an_engine_starts_leaves_the_forkserver_and_other_engines_alone():
    """Ctrl-C between the forkserver's connect and its fds: delivered once the start is done,
    and the forkserver every engine shares lives on (it died, and every engine with it)."""
    run = run_python(textwrap.dedent('''
        import signal, sys, warnings
        import multiprocessing.forkserver as fs
        import toy_engine as te
        cfg = te.EngineConfig(mode="zos", max_batch_size=2, device="cpu")
        a = te.Engine(cfg)
        ref = [c.token_ids for c in a.generate(["Once upon a time"], max_new_tokens=5)]
        lines = open(fs.__file__).read().splitlines()
        def tracer(frame, event, arg):
            code = frame.f_code
            if code.co_name != "connect_to_new_process" or code.co_filename != fs.__file__:
                return None
            def local(frame, event, arg):
                if event == "line" and "parent_r, child_w = os.pipe()" in lines[frame.f_lineno - 1]:
                    sys.settrace(None)
                    signal.raise_signal(signal.SIGINT)
                return local
            return local
        sys.settrace(tracer)
        try:
            te.Engine(cfg)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        sys.settrace(None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [c.token_ids for c in a.generate(["Once upon a time"], max_new_tokens=5)]
        print("failure", a.device.failure(), "warnings", len(caught), "same", got == ref)
        b = te.Engine(cfg)
        again = [c.token_ids for c in b.generate(["Once upon a time"], max_new_tokens=5)]
        print("new engine", again == ref)
    '''))
    assert "interrupted" in run.stdout.splitlines(), run.stdout + run.stderr[-2000:]
    assert "failure None warnings 0 same True" in run.stdout, run.stdout + run.stderr[-2000:]
    assert "new engine True" in run.stdout and "EOFError" not in run.stderr, run.stderr[-2000:]


def test_ctrl_c_is_not_held_while_a_plugin_is_pickled():
    """A correction plug-in whose ``__reduce__`` runs 10 s: a Ctrl-C 1 s in stops generate
    within a few seconds (it waited for the pickling: SIGINT was held), and the engine runs.
    Since round nine generate pickles it while checking its arguments, so the Ctrl-C lands
    before the call has requests: the last run's stay as they ended."""
    run = run_python(textwrap.dedent('''
        import os, signal, threading, time
        import toy_engine as te
        from toy_engine import kernels
        class Correction:
            def __call__(self, meta, accepted, block_size):
                kernels.correct_seqlens_qk(meta, accepted, block_size)
            def __reduce__(self):
                end = time.monotonic() + 10.0
                while time.monotonic() < end:
                    pass
                return (Correction, ())
        engine = te.Engine(te.EngineConfig(mode="zos", max_batch_size=2, num_draft_tokens=2,
                                           device="cpu"))
        ref = [c.token_ids for c in engine.generate(["Once upon a time"], max_new_tokens=6)]
        sent = []
        threading.Timer(1.0, lambda: (sent.append(time.monotonic()),
                                      os.kill(os.getpid(), signal.SIGINT))).start()
        try:
            engine.generate(["Once upon a time"], max_new_tokens=6, correction=Correction())
            print("returned")
        except KeyboardInterrupt:
            print("interrupted")
        print("lag", time.monotonic() - sent[0])
        print("reasons", [r.finish_reason for r in engine.requests])
        out = [c.token_ids for c in engine.generate(["Once upon a time"], max_new_tokens=6)]
        print("same", out == ref)
    '''))
    lines = run.stdout.splitlines()
    assert "interrupted" in lines, run.stdout + run.stderr[-2000:]
    lag = float(next(line for line in lines if line.startswith("lag")).split()[1])
    assert lag < 4.0, f"generate ended {lag:.1f} s after the Ctrl-C"
    assert "reasons ['length']" in lines and "same True" in lines, run.stdout


@pytest.mark.parametrize("make_loop, words", [
    (lambda: plugins_2026.batch_queue(2, lambda e, p, h: LiesInt(5)), ["before_sample", "5"]),
    (lambda: plugins_2026.future_key(lambda req, b: LiesInt(99)), ["key returned 99", "0 to 2"]),
    (lambda: plugins_2026.future_key(lambda req, b: LiesInt(-1)), ["key returned -1", "0 to 2"]),
], ids=["before_sample", "key-past-the-rows", "key-negative"])
def test_a_plugins_int_that_lies_in_comparisons_is_a_bad_answer(make_loop, words):
    """07b's plug-ins: what is checked is the plain int that is used (an IndexError, a device
    error in 'forward', or silently the wrong row, before)."""
    with plugins.ring(8):
        engine = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3))
    try:
        with pytest.raises(plugins_2026.BadAnswer) as caught:
            engine.generate(["Once upon a time", "One day", "There was a fox"], max_new_tokens=6,
                            loop=make_loop())
        assert all(w in str(caught.value) for w in words), str(caught.value)
        assert not engine.scheduler.has_work()
        # an int whose int() differs is used as the value it compares as: here, row b
        outs = engine.generate(["Once upon a time", "One day"], max_new_tokens=6,
                               loop=plugins_2026.future_key(lambda req, b: IntDiffers(b)))
        plain = engine.generate(["Once upon a time", "One day"], max_new_tokens=6,
                                loop=plugins_2026.future_key(lambda req, b: b))
        assert [c.token_ids for c in outs] == [c.token_ids for c in plain]
    finally:
        engine.close()


@pytest.mark.parametrize("field", ["mode", "device", "constraint"])
def test_an_engineconfig_choice_that_lies_in_eq_is_refused_when_built(field):
    """A str subclass equal to everything got past ``value in choices`` (and ran, or failed
    later naming cuda, or landed in the timeline's meta)."""
    with pytest.raises(ValueError, match=f"unknown {field} 'nonsense'"):
        te.EngineConfig(**{field: LiesStr("nonsense")})
    config = te.EngineConfig(**{field: LiesStr({"mode": "zos", "device": "cpu",
                                                "constraint": "title_case"}[field])})
    assert type(getattr(config, field)) is str  # kept plain: what was checked is what runs


@pytest.mark.parametrize("change", [
    lambda e: setattr(e.tokenizer, "eos_id", 5),
    lambda e: setattr(e.device, "run_record", None),
    lambda e: setattr(e._engine, "_next_id", "x"),
    lambda e: setattr(e._engine, "context_len", 3),
    lambda e: setattr(e._engine, "num_slots", 1),
], ids=["eos_id", "run_record", "_next_id", "context_len", "num_slots"])
def test_a_wrong_answers_change_to_the_shared_engine_never_fails_a_later_right_answer(
        change, monkeypatch):
    """The loop's view refuses ``engine.x = ...`` but not a change inside its parts: the next
    check now sees it and starts a fresh engine (the right answer failed, "your loop raised")."""
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 20.0)

    def wrong(engine):
        change(engine)
        loops_for_tests.serial_loop(engine)

    checks.check_serial_loop(wrong)
    verdict = checks.check_serial_loop(loops_for_tests.serial_loop)
    assert verdict.passed, verdict.message
    assert "a fresh engine was started" in verdict.message


def test_a_check_called_inside_a_checks_run_gets_a_verdict(monkeypatch):
    """A learner's loop calling a check: the inner check took the busy engine from the pool and
    failed to close it (RuntimeError, its device process orphaned)."""
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 20.0)
    inner = []

    def loop(engine):
        inner.append(checks.check_serial_loop(loops_for_tests.serial_loop))
        loops_for_tests.serial_loop(engine)

    outer = checks.check_serial_loop(loop)
    assert outer.passed, outer.message
    assert inner and not inner[0].passed and inner[0].category == "nested", inner
    assert "another check's run" in inner[0].message
    again = checks.check_serial_loop(loops_for_tests.serial_loop)
    assert again.passed and "fresh engine" not in again.message, again.message
