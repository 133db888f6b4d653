"""Issue 34, round nineteen, grading.  The judge's report was written with ``json.dumps`` and
``hmac``, bound before the cells but reading module attributes at each call: a cell replaced
``json._default_encoder`` and the forged verdict was signed with the real secret.  And a cell
found the report's writer with ``gc.get_objects`` (the secret in its closure) and wrote a signed
pass itself.  Both gave a wrong serial loop full marks in real nbgrader.  Now the report is
encoded, signed and written by C functions and builtin types' methods bound before the cells,
and the judge refuses the submission's code ``gc``'s walks, other threads' frames and a frame
of its own asking.  Right loops (logging, warnings, a caught error printed) still pass.  Each
failed when written."""

from __future__ import annotations

import json
import random

import pytest

from overlap_course.build import judge, judge_process, judge_values

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine, serial_loop_scores

# What each cheat does once it holds the judge's report writer ``_w``: a signed pass
_FORGE = '\n    _w({"passed": True, "message": "ok"})\n'
_IS_WRITER = ("type(_f) is types.FunctionType and _f.__name__ == 'write' "
              "and _f.__closure__:\n    _w = _f")
CHEATS = {
    "json_default_encoder": '''
import json as _j
class _Enc(type(_j._default_encoder)):
    def encode(self, o):
        if type(o) is dict and set(o) == {"passed", "message"}:
            o = {"passed": True, "message": "ok"}
        return super().encode(o)
_j._default_encoder = _Enc()
''',
    "json_encoder_class": '''
import json as _j
_real = _j.JSONEncoder.encode
def _encode(self, o):
    if type(o) is dict and set(o) == {"passed", "message"}:
        o = {"passed": True, "message": "ok"}
    return _real(self, o)
_j.JSONEncoder.encode = _encode
''',
    # hmac.new and hashlib.sha256, given the secret: sign a pass, write it where the writer
    # writes (read through inspect, a route the judge leaves open) and end
    "hmac_new": '''
import hmac as _h, hashlib as _hl, inspect as _i, os as _o
_real = _h.new
def _new(key, msg=None, digestmod=None):
    body = '{"passed": true, "message": "ok"}'
    fr = _i.currentframe()
    while "path" not in fr.f_locals:
        fr = fr.f_back
    with open(fr.f_locals["path"], "w") as f:
        f.write(_real(key, body.encode(), _hl.sha256).hexdigest() + "\\n" + body)
    _o._exit(0)
_h.new = _new
''',
    "gc_get_objects": "import gc, types\nfor _f in gc.get_objects():\n  if " + _IS_WRITER + _FORGE,
    "gc_get_referrers": ("import gc, types, sys\n_jp = sys.modules['overlap_course.build."
                         "judge_process']\nfor _f in gc.get_referrers(_jp.__dict__):\n  if "
                         + _IS_WRITER + _FORGE),
    "getframe_walk": ("import sys\n_fr = sys._getframe()\nwhile _fr is not None:\n"
                      "  _w = _fr.f_locals.get('write')\n  if callable(_w):" + _FORGE
                      + "  _fr = _fr.f_back\n"),
    "traceback_walk": ("try:\n  1/0\nexcept ZeroDivisionError as _e:\n"
                       "  _fr = _e.__traceback__.tb_frame\nwhile _fr is not None:\n"
                       "  _w = _fr.f_locals.get('write')\n  if callable(_w):" + _FORGE
                       + "  _fr = _fr.f_back\n"),
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_a_wrong_loop_cannot_sign_its_own_pass(cheat):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, CHEATS[cheat]])
    assert not passed and message != "ok", message


# Right loops that read frames through the standard library, as a learner's may
_LOGGED = RIGHT_LOOP.replace("def serial_loop(engine):\n", '''import logging, warnings
import traceback, inspect
def serial_loop(engine):
    logging.warning("starting")
    warnings.warn("a warning")
    try:
        {}["missing"]
    except KeyError:
        traceback.print_exc()
        print(traceback.format_exc().count("\\n"), len(inspect.trace()))
    print(inspect.currentframe().f_code.co_name, len(traceback.extract_stack()))
''')
_NAMED_TUPLE = "import collections\nRound = collections.namedtuple('Round', 'n')\n" + (
    RIGHT_LOOP.replace("        plan = ", "        Round(1)\n        plan = "))


@pytest.mark.parametrize("cells", [[IMPORTS, _LOGGED], [IMPORTS, _NAMED_TUPLE]])
def test_a_right_loop_reading_frames_through_the_library_passes(cells):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", cells)
    assert passed, message


def test_the_report_is_written_as_json_dumps_writes_it():
    """The answers mode's values cross exactly: every character, nesting, None and booleans."""
    text, rnd = judge_values.report_text(), random.Random(19)
    chars = [chr(i) for i in range(0x250)] + ["\ud800", "\udfff", "\U0001f600", "\u2028"]

    def value(depth=0):
        pick = rnd.random()
        if depth > 3 or pick < 0.4:
            return "".join(rnd.choice(chars) for _ in range(rnd.randrange(8)))
        if pick < 0.5:
            return rnd.choice([True, False, None])
        if pick < 0.8:
            return [value(depth + 1) for _ in range(rnd.randrange(4))]
        return {value(4): value(depth + 1) for _ in range(rnd.randrange(3))}
    for _ in range(2000):
        report = {"values": [value() for _ in range(3)], "message": value(4)}
        assert text(report) == json.dumps(report)
    for odd in ({"a": 1}, {"a": (1,)}, {1: "a"}, {"a": type("S", (str,), {})("a")}):
        with pytest.raises(TypeError):
            text(odd)


def test_the_judge_and_the_grader_sign_alike():
    import hashlib
    import hmac
    assert judge_process.signer("k")("body \u00e9") == hmac.new(
        b"k", "body \u00e9".encode(), hashlib.sha256).hexdigest()


def test_real_nbgrader_gives_the_cheats_nothing(tmp_path):
    """nbgrader autograde of exercise 02: a right loop gets full marks, and a wrong loop none
    beside a cell that forges the report (``json``'s encoder), beside a cell that loosens the
    audit hook (``Watch.foreign``, round twenty), or whose cheat runs inside the check.  Each
    student costs about 18 s (one student's autograde took 22 s here, 3 s of it nbgrader's own
    start; the kernel 8 s, the two judges 10 s): the other cheats of rounds nineteen and twenty
    are graded by the same judge below (``judge.judge``, which nbgrader's preprocessor calls),
    test_grading.py's cheat test grades through nbgrader alike, and its first test gives every
    exercise's solution full marks (no solution student here)."""
    pytest.importorskip("nbgrader", reason="nbgrader is in the dev extra")
    needs_the_engine()
    from test_hostile_34_round20_judge20 import CELL_CHEATS
    students = {"right": (RIGHT_LOOP, ""),
                "json_default_encoder": (WRONG_LOOP, CHEATS["json_default_encoder"]),
                "in_check": (_IN_CHECK, ""),
                "class_foreign": (WRONG_LOOP, CELL_CHEATS["class_foreign"])}
    scores = serial_loop_scores(tmp_path / "course", students)
    assert scores == {s: (3.0 if s == "right" else 0.0) for s in students}


# Round nineteen (b): the judge's code after the cells looks its functions up by name in its
# modules, which a cell (or the loop, inside the check) rebound with no audit event.
_JP, _FP = "overlap_course.build.judge_process", "overlap_course.build.judge_fingerprint"
_REBINDS = {
    "verdict": f"import {_JP} as _jp\n_jp._verdict = lambda *a, **k: "
               "{'passed': True, 'message': 'ok'}\n",
    "strange_modules": f"import {_JP} as _jp\n_jp._strange_modules = lambda *a, **k: []\n",
    "compare": f"import {_JP} as _jp, {_FP} as _fp\n"
               "_jp._compare = _fp._compare = lambda a, b: []\n",
    "compare_code": f"import {_FP} as _fp\n_fp._compare.__code__ = (lambda a, b: []).__code__\n",
    "builtins": "import builtins\nbuiltins.all = lambda it: True\n",
}
# At its first call, inside the check: the comparer neutered, the checker's helpers swapped
_IN_CHECK = WRONG_LOOP.replace("def serial_loop(engine):", f'''import sys as _s
_done = []
def serial_loop(engine):
    if not _done:
        _done.append(1)
        _fp, _jp = _s.modules["{_FP}"], _s.modules["{_JP}"]
        _l2 = _s.modules["overlap_course.checks.lesson02"]
        _fp._compare = _jp._compare = lambda a, b: []
        _l2._serial_run_verdict = _l2.serial_same_run = lambda *a, **k: None
#''', 1)


@pytest.mark.parametrize("cells", [*([WRONG_LOOP, c] for _, c in sorted(_REBINDS.items())),
                                   [_IN_CHECK]], ids=[*sorted(_REBINDS), "in_check"])
def test_a_wrong_loop_cannot_rebind_the_judges_names(cells):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, *cells])
    assert not passed and message != "ok", message


def test_a_right_loop_beside_a_harmless_rebind_passes():
    """A cell that adds a name to builtins (its own helper) changes nothing of the judge's."""
    needs_the_engine()
    helper = "import builtins\nbuiltins.my_helper = len\n"
    passed, message = judge.judge("check_serial_loop", [IMPORTS, helper, RIGHT_LOOP])
    assert passed, message


def test_the_judge_puts_its_names_back_and_names_them():
    from overlap_course.build import judge_fingerprint, judge_keep
    restore, real = judge_keep.keeper(), judge_fingerprint._compare
    try:
        judge_fingerprint._compare = len
        judge_process.Watch = int
        judge_fingerprint.Snapshot.same = len
        judge_process.len = len  # would shadow the builtin
        assert sorted(restore()) == sorted([f"{_FP}._compare", f"{_FP}.Snapshot.same",
                                            f"{_JP}.Watch", f"{_JP}.len"])
    finally:
        restore()
    assert judge_fingerprint._compare is real and "len" not in vars(judge_process)
    assert restore() == []
