"""Issue 34's third hostile round: each case fails before its fix.  A learner's object that
returns the wrong type from a dunder (the interpreter raises in the check's own frame, so no
learner frame is on the traceback), a BaseException of the learner's, a string whose methods
lie; command lines as subprocesses, bounded in time."""

from __future__ import annotations

import numbers
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_course import checks
from overlap_course.checks import sandbox

ROOT = Path(__file__).resolve().parents[1]
TABLE = dict(table=[5, 2, 9], pos=9, block_size=4)


def _run(*args: str, cwd=None, timeout=120, stdin=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env, input=stdin)


def _one_clear_line(run, *words: str) -> None:
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-500:]
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-500:]
    assert all(w in run.stderr for w in words), run.stderr


def _a_false_verdict(call):
    try:
        verdict = call()
    except BaseException as err:  # noqa: BLE001 - the bug: any escape at all
        pytest.fail(f"the check raised {type(err).__name__}: {err}")
    assert isinstance(verdict, checks.Verdict), verdict
    assert not verdict.passed, verdict.message
    return verdict


# ------------------------------------------------------------------ dunders of the wrong type

class FloatReturnsText(float):
    def __float__(self):
        return "37"


class IntReturnsText(int):
    def __int__(self):
        return "37"

    def __index__(self):
        return "37"


class NegativeLength(list):
    def __len__(self):
        return -1


class HugeLength(list):
    def __len__(self):
        return 2**70


class RegisteredReal:
    """Registered as a real number, with no ``__float__``: ``float()`` refuses it."""


numbers.Real.register(RegisteredReal)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("answer", [FloatReturnsText(37.0), IntReturnsText(37),
                                    NegativeLength([37]), HugeLength([37]), RegisteredReal()],
                         ids=["float-returns-text", "int-returns-text", "len-negative", "len-2**70",
                              "registered-real"])
def test_check_slot_answers_a_dunder_of_the_wrong_type(answer):
    """TypeError ``__float__ returned non-float`` / ``__int__ returned non-int``, ValueError
    ``__len__() should return >= 0``, OverflowError ``cannot fit 'int' into an index-sized
    integer``, TypeError ``float() argument must be ... not 'RegisteredReal'``: raised by the
    interpreter in the check's frame, so ``harness.learner_raised`` finds no learner frame and
    re-raises (same in 11-25 notebook checks each)."""
    _a_false_verdict(lambda: checks.check_slot(answer, **TABLE))


@pytest.mark.timeout(30)
def test_check_true_key_length_answers_a_float_whose_float_returns_text():
    _a_false_verdict(lambda: checks.check_true_key_length(FloatReturnsText(27.0), 27, accepted=4))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", [FloatReturnsText(0.3), RegisteredReal()],
                         ids=["float-returns-text", "registered-real"])
def test_check_idle_fraction_answers_a_function_returning_an_odd_real(value, make_engine,
                                                                      monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)
    engine = make_engine(mode="serial", max_batch_size=4)
    engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
    _a_false_verdict(lambda: checks.check_idle_fraction(lambda timeline: value, engine))


@pytest.mark.timeout(60)
def test_check_ring_slots_answers_a_function_returning_an_int_whose_int_returns_text(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)
    _a_false_verdict(lambda: checks.check_ring_slots(lambda *a, **k: IntReturnsText(1)))


# ------------------------------------------------------------------ the learner's BaseException

class LearnersBaseException(BaseException):
    """Not KeyboardInterrupt (the person at the keyboard) nor SystemExit (handled): the
    learner's own."""


def _stops_with_base_exception():
    yield 1
    raise LearnersBaseException("learner")


@pytest.mark.timeout(30)
def test_a_notebook_check_answers_an_iterator_raising_a_base_exception():
    """``check_three_rounds`` (and 6 more) let the learner's BaseException out of the check."""
    _a_false_verdict(lambda: checks.check_three_rounds(_stops_with_base_exception()))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", [LearnersBaseException, GeneratorExit])
def test_an_exercise_check_answers_a_function_raising_a_base_exception(error, monkeypatch):
    """``_time_limited`` catches SystemExit, TimeUp and Exception: every exercise check (11 of
    11) lets a learner's ``raise GeneratorExit`` or own BaseException out."""
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)

    def answer(*args, **kwargs):
        raise error("the learner's function raised")
    _a_false_verdict(lambda: checks.check_ring_slots(answer))


# ------------------------------------------------------------------ a wrong answer that passes

class AlwaysEqual(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__

    def strip(self, *args):
        return self

    lower = strip

    def endswith(self, *args):
        return False

    startswith = endswith


class Lies(str):
    """A plain-looking wrong answer, "zz", whose ``strip``/``lower`` return a string that equals
    anything: ``answers.name`` returns the learner's object, and ``==`` is the learner's."""

    def strip(self, *args):
        return AlwaysEqual("zz")

    lower = strip


@pytest.mark.timeout(60)
def test_a_lying_string_does_not_pass_check_largest_host_stage(make_engine):
    engine = make_engine(mode="serial", max_batch_size=4)
    engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
    _a_false_verdict(lambda: checks.check_largest_host_stage(Lies("zz"), engine.timeline))


@pytest.mark.timeout(60)
def test_a_lying_string_does_not_pass_check_idle_sync():
    _a_false_verdict(lambda: checks.check_idle_sync(Lies("zz"), "a100_event_sync"))


# ------------------------------------------------------------------ controls (pass now)

@pytest.mark.timeout(30)
def test_control_a_plain_wrong_slot_and_a_raising_len_get_false_verdicts():
    assert not checks.check_slot(36, **TABLE).passed
    verdict = _a_false_verdict(lambda: checks.check_slot(RaisesLen([37]), **TABLE))
    assert verdict.category == "raised"


class RaisesLen(list):
    def __len__(self):
        raise RuntimeError("learner")


# ------------------------------------------------------------------ the trace command

KERNEL = {"cat": "kernel", "name": "k", "ph": "X", "ts": 0, "dur": 5}


def _summary(tmp_path, trace: str) -> subprocess.CompletedProcess:
    (tmp_path / "t.json").write_text(trace)
    return _run("overlap_course.traces.kineto", "summary", "t.json", cwd=tmp_path)


@pytest.mark.timeout(60)
def test_a_trace_whose_device_work_is_all_on_stream_minus_1_names_the_problem(tmp_path):
    """Exit 2 with ``error: min() arg is an empty sequence``: an internal error's text, which
    says nothing about the trace (stream -1 is left out of the per-stream figures)."""
    import json
    run = _summary(tmp_path, json.dumps({"traceEvents": [{**KERNEL, "args": {"stream": -1}}]}))
    _one_clear_line(run, "t.json")
    assert "min() arg" not in run.stderr and "empty sequence" not in run.stderr, run.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trace", [
    '{"nottrace": 1, "%s": 1}' % ("k" * 1_000_000),
    '{"traceEvents": [{"cat": "kernel", "name": "k", "ts": 0, "dur": 5, '
    '"args": {"stream": "%s"}}]}' % ("s" * 1_000_000)], ids=["long-key", "long-stream"])
def test_a_refusal_quotes_a_short_excerpt_not_a_megabyte(tmp_path, trace):
    """The refusal is one line, but it quotes the whole key / args.stream: 1,000,145 bytes on
    stderr for a 1 MB key (the keys are cut to 8, not their length)."""
    run = _summary(tmp_path, trace)
    _one_clear_line(run)
    assert len(run.stderr) < 2000, f"{len(run.stderr)} bytes on stderr"


# ------------------------------------------------------------------ the progress record

def _slot_line(category: str) -> str:
    import json
    return json.dumps({"notebook": "01_tiny_gpt", "check": "check_slot", "passed": False,
                       "category": category, "time": 1})


@pytest.mark.timeout(60)
def test_a_record_line_with_a_lone_surrogate_does_not_stop_the_progress_view(tmp_path):
    """JSON ``"\\ud800"`` is ASCII (it passes the UTF-8 check) but reads as a lone surrogate:
    printing the table fails, exit 2 ``error: 'utf-8' codec can't encode character '\\ud800'
    ... surrogates not allowed`` -- one odd line hides the learner's whole record."""
    record = tmp_path / "progress.jsonl"
    record.write_text(_slot_line("\ud800oops") + "\n")
    run = _run("overlap_course.progress", str(record))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "check_slot" in run.stdout


@pytest.mark.timeout(60)
def test_a_record_category_with_a_line_break_does_not_break_the_table(tmp_path):
    """A category holding a line break and a terminal escape is printed raw: the table gains a
    line, and ``ESC[31m`` turns the learner's terminal red."""
    record = tmp_path / "progress.jsonl"
    record.write_text(_slot_line("wrong\n    passed       check_race\x1b[31m") + "\n")
    run = _run("overlap_course.progress", str(record))
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stdout
    assert "passed       check_race\n" not in run.stdout.split("check_slot", 1)[-1][:80]


@pytest.mark.timeout(60)
def test_control_a_plain_record_line_is_shown(tmp_path):
    record = tmp_path / "progress.jsonl"
    record.write_text(_slot_line("wrong") + "\n")
    run = _run("overlap_course.progress", str(record))
    assert run.returncode == 0 and "check_slot (last mistake: wrong)" in run.stdout


# ------------------------------------------------------------------ grading: the judge

# A serial loop that runs no round, and replaces the checker's per-run verdict with a lenient
# one that puts the original back on the check's last run: when the check ends, every module
# is as it was, so neither the sandbox's restore nor the judge's fingerprint sees a change.
SELF_RESTORING = '''
import overlap_course.checks.lesson02 as _L
_orig, _calls = _L._serial_run_verdict, [0]

def _lenient(*args, **kwargs):
    _calls[0] += 1
    if _calls[0] == 4:
        _L._serial_run_verdict = _orig
    return None

def serial_loop(engine):
    if _calls[0] == 0:
        _L._serial_run_verdict = _lenient
'''


@pytest.mark.timeout(120)
def test_a_self_restoring_patch_does_not_pass_the_judge():
    """``judge.judge('check_serial_loop', [SELF_RESTORING])`` is ``(True, 'the serial loop
    reproduces the reference: 4 prompts, 0 rounds, ...')``: a loop that does nothing, graded
    as passed (in 5 s, through the real fresh judge process)."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [SELF_RESTORING])
    assert not passed, message


@pytest.mark.timeout(60)
def test_control_a_loop_that_runs_no_round_fails_the_check():
    _a_false_verdict(lambda: checks.check_serial_loop(lambda engine: None))


# ------------------------------------------------------------------ the engine's arguments

@pytest.mark.timeout(60)
def test_generate_refuses_a_huge_range_of_prompts_by_its_first_item(make_engine):
    """``engine.generate(range(10**10))`` raised MemoryError: ``check_prompts`` copies the whole
    sequence (``list(prompts)``) before it looks at one item."""
    engine = make_engine(mode="serial", max_batch_size=2)
    with pytest.raises(TypeError, match="prompt"):  # "prompt 0 must be a str" or "prompts must"
        engine.generate(range(10**10), max_new_tokens=1)
    assert engine.generate(["Once"], max_new_tokens=2)[0].finish_reason == "length"


# ------------------------------------------------------------------ the room's progress service

def _guide(tmp_path: Path, kind: str) -> str:
    path = tmp_path / f"guide-{kind}"
    if kind == "folder":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00 not a guide")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        return "/dev/zero"
    return str(path)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["folder", "not-utf8", "fifo", "device"])
def test_the_service_refuses_a_guide_file_it_cannot_read_at_start(tmp_path, kind, monkeypatch,
                                                                capsys):
    """``--guide-file`` is never looked at before serving: the service starts, and the guide
    page raises per request (IsADirectoryError, UnicodeDecodeError), or blocks the event loop
    -- every request of the room -- on a FIFO, or reads /dev/zero until memory runs out."""
    from overlap_course import progress_service as ps
    monkeypatch.setattr(ps, "serve", lambda store, a, host, port: 0)  # no hub here
    code = ps.main(["--db", str(tmp_path / "db.sqlite"), "--guide-file", _guide(tmp_path, kind)])
    err = capsys.readouterr().err
    assert code == 2 and "guide" in err and len(err.strip().splitlines()) == 1, (code, err)


@pytest.mark.timeout(30)
def test_the_guide_reader_does_not_block_on_a_fifo(tmp_path):
    """``guide_mistakes(Path(fifo))`` never returns (``read_text`` waits for a writer); in the
    service that is the guide page's handler, on the event loop."""
    fifo = _guide(tmp_path, "fifo")
    code = ("import sys; from pathlib import Path\n"
            "from overlap_course import progress_service as ps\n"
            "try:\n    ps.guide_mistakes(Path(sys.argv[1]))\nexcept ValueError:\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", code, fifo], capture_output=True, text=True,
                             timeout=8, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("guide_mistakes on a FIFO still waiting after 8 s")
    assert run.returncode == 0, run.stderr[-300:]


@pytest.mark.timeout(30)
def test_control_the_service_starts_with_the_shipped_guide(tmp_path, monkeypatch):
    from overlap_course import progress_service as ps
    monkeypatch.setattr(ps, "serve", lambda store, a, host, port: 0)
    guide = str(ROOT / "docs" / "instructor_guide.md")
    assert ps.main(["--db", str(tmp_path / "db.sqlite"), "--guide-file", guide]) == 0
    assert ps.guide_mistakes(Path(guide))


# ------------------------------------------------------------------ an answer that never ends

STUCK = '''
import sys
from overlap_course import checks
from overlap_course.checks import sandbox
sandbox.TIME_LIMIT_S = 2.0  # the exercise checks' limit, short here
def stuck():
    while True:
        pass
    yield
class LenLoops(list):
    def __len__(self):
        while True:
            pass
if sys.argv[1] == "iterator":
    verdict = checks.check_swapped_order(stuck(), True, False)
else:
    verdict = checks.check_slot(LenLoops([37]), table=[5, 2, 9], pos=9, block_size=4)
print("verdict", verdict.passed)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answer", ["iterator", "len"])
def test_a_notebook_check_on_an_answer_that_never_returns_ends(answer):
    """A notebook check has no time limit (only exercise checks do): an answer whose next()
    or ``__len__`` loops forever hangs ``check_swapped_order`` / ``check_slot`` -- still running
    after 10 s; the exercise checks stop such code with a ``time_limit`` verdict."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", STUCK, answer], capture_output=True,
                             text=True, timeout=10, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the check was still running after 10 s (its limit here: 2 s)")
    assert "verdict False" in run.stdout, run.stderr[-300:]


# ------------------------------------------------------------------ export's two output files

def _export_both(tmp_path) -> subprocess.CompletedProcess:
    return _run("overlap_course.traces.kineto", "export", "o.json", "--prompts", "1",
                "--max-new-tokens", "2", cwd=tmp_path, timeout=15)


@pytest.mark.timeout(60)
def test_export_of_both_modes_refuses_a_fifo_as_the_serial_file(tmp_path):
    """OUT is checked (a FIFO as OUT is refused), but not OUT_serial / OUT_zos, the files that
    recording both modes writes: with o_serial.json a FIFO, the command records both runs, then
    waits forever to open the FIFO (still running after 60 s, `timeout` rc 124)."""
    os.mkfifo(tmp_path / "o_serial.json")
    try:
        run = _export_both(tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("export still waiting on the FIFO o_serial.json after 15 s")
    _one_clear_line(run, "o_serial.json")


@pytest.mark.timeout(60)
def test_export_of_both_modes_refuses_a_folder_as_the_zos_file_before_writing(tmp_path):
    """Exit 2 ``cannot write 'o_zos.json': Is a directory`` -- but only after recording, with
    o_serial.json already written: half of the pair, from a command that failed."""
    (tmp_path / "o_zos.json").mkdir()
    _one_clear_line(_export_both(tmp_path), "o_zos.json")
    assert not (tmp_path / "o_serial.json").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("request_id", [True, 1.0], ids=["bool", "float"])
def test_abort_refuses_an_id_that_is_not_an_integer(make_engine, request_id):
    """``engine.abort(True)`` / ``engine.abort(1.0)`` from ``on_round`` aborts request 1 (found
    by ``r.id == request_id``), where every other integer argument of the engine refuses a bool
    or a float with a TypeError naming it."""
    engine = make_engine(mode="serial", max_batch_size=2)
    errors = []

    def on_round(engine, round):
        if round == 1:
            try:
                engine.abort(request_id)
            except (TypeError, ValueError) as err:
                errors.append(err)
    out = engine.generate(["Once upon a time", "The bird said"], max_new_tokens=6,
                          on_round=on_round)
    assert [c.finish_reason for c in out] == ["length", "length"] and errors, out


# ------------------------------------------------------------------ code that blocks, not spins

BLOCKS = '''
import sys, threading, time
from overlap_course import checks
from overlap_course.checks import sandbox
sandbox.TIME_LIMIT_S = 2.0
def waits(engine):
    threading.Event().wait()
def sleeps(engine):
    time.sleep(120)
verdict = checks.check_serial_loop(waits if sys.argv[1] == "wait" else sleeps)
print("verdict", verdict.category)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["wait", "sleep"])
def test_an_exercise_check_stops_code_that_blocks(how):
    """The time limit is an async exception raised at the learner's next line: code blocked in
    C -- ``threading.Event().wait()``, ``time.sleep(120)`` -- never reaches one. With a 2 s
    limit the check was still running after 12 s (a ``while True: pass`` loop: time_limit
    verdict in 3.3 s). A signal (setitimer on the main thread) would interrupt both."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", BLOCKS, how], capture_output=True,
                             text=True, timeout=12, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the check was still running after 12 s (its limit here: 2 s)")
    assert "verdict time_limit" in run.stdout, (run.stdout, run.stderr[-300:])


@pytest.mark.timeout(60)
def test_control_an_exercise_check_stops_a_spinning_loop(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 2.0)

    def spins(engine):
        while True:
            pass
    assert _a_false_verdict(lambda: checks.check_serial_loop(spins)).category == "time_limit"


# A wrong idle_fraction (it returns 0.0 whatever the timeline), judged on an `engine` the
# submission's own cells reshaped: the run's device spans laid end to end, its stats set to 0.
FORGED_ENGINE = '''
import dataclasses
import toy_engine as te

engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
_t, _spans = 0.0, []
for _s in engine.timeline.spans:
    if _s.lane == "device":
        _d = _s.end_ms - _s.start_ms
        _s = dataclasses.replace(_s, start_ms=_t, end_ms=_t + _d)
        _t += _d
    _spans.append(_s)
engine.timeline.spans[:] = _spans
engine.stats = dataclasses.replace(engine.stats, device_idle_fraction=0.0)

def idle_fraction(timeline):
    return 0.0
'''


@pytest.mark.timeout(120)
def test_the_judge_does_not_take_the_submissions_engine_on_trust():
    """``judge.judge('check_idle_fraction', [FORGED_ENGINE])`` is ``(True, 'your idle fraction
    equals engine.stats.device_idle_fraction, and it follows the timeline ...')``: the graded
    call's ``engine`` comes from the submission's cells, which may reshape its timeline and
    stats until a constant function is right (only its type is checked)."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_idle_fraction", [FORGED_ENGINE])
    assert not passed, message


@pytest.mark.timeout(120)
def test_control_the_judge_fails_a_constant_idle_fraction_on_a_plain_run():
    from overlap_course.build import judge
    plain = FORGED_ENGINE.split("_t, _spans")[0] + "def idle_fraction(timeline):\n    return 0.0\n"
    passed, message = judge.judge("check_idle_fraction", [plain])
    assert not passed, message


# The judge trusts a verdict only if no thread of the submission still runs; it knows a
# submission's thread by its target's code (``<submission cell N>``), which a Timer (target
# None, run in threading.py) or a Thread around functools.partial does not show.
DELEGATES = '''
import functools, threading, time
import toy_engine as te
def serial_loop(engine):
    te.loops.serial_loop(engine)
'''
LEFT_THREADS = {
    "timer": "threading.Timer(100, lambda: None).start()\n",
    "partial": "threading.Thread(target=functools.partial(time.sleep, 100), daemon=True).start()\n",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("thread", sorted(LEFT_THREADS))
def test_the_judge_sees_every_thread_the_submission_leaves_running(thread):
    """``(True, 'the serial loop reproduces the reference ...')`` with a Timer / a partial's
    thread still running (the same cell with ``Thread(target=lambda: ...)``: not trusted)."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [DELEGATES + LEFT_THREADS[thread]])
    assert not passed and "thread" in message, message


@pytest.mark.timeout(120)
def test_control_the_judge_sees_a_plain_thread_left_running():
    from overlap_course.build import judge
    cell = DELEGATES + "threading.Thread(target=lambda: time.sleep(100), daemon=True).start()\n"
    passed, message = judge.judge("check_serial_loop", [cell])
    assert not passed and "thread" in message, message
