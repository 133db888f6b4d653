"""Issue 34's seventh hostile round, the judge: C code that reaches files with no audit event
(``torch.from_file`` read the solution and, through a shared mapping, rewrote a module the next
judge imports; ``sqlite3`` wrote where the judge may not), a course class re-based through
``__bases__`` (same ``__dict__``), and a right answer under an IPython magic judged a syntax
error.  Each failed when written; where this system has Landlock the kernel fences the judge's
files whatever code reaches them (overlap_course/build/landlock.py)."""

from __future__ import annotations

import pytest

from hostile_support import SERIAL_LOOP, WRONG_VALUE, judged_in_a_throwaway_venv
from overlap_course.build import judge, landlock

needs_landlock = pytest.mark.skipif(landlock.abi() == 0, reason="no Landlock on this system: "
                                    "C code reaches files past the audit hook (documented)")

ZOS = '''
import toy_engine as te
def serial_loop(engine):
    te.loops.zos_loop(engine)
'''
TORCH_READS_THE_SOLUTION = ZOS + '''
import json, os, torch, overlap_course
_path = os.path.join(os.path.dirname(os.path.dirname(overlap_course.__file__)),
                     "solutions", "02_serial_loop.ipynb")
_raw = torch.from_file(_path, shared=False, size=os.stat(_path).st_size, dtype=torch.uint8)
for _c in json.loads(bytes(_raw.tolist()).decode())["cells"]:
    _src = "".join(_c["source"])
    if _c["cell_type"] == "code" and "def serial_loop(" in _src:
        exec(_src)
'''


@needs_landlock
def test_torch_from_file_cannot_read_the_solution_in_the_judge():
    passed, message = judge.judge("check_serial_loop", [TORCH_READS_THE_SOLUTION],
                                  private=[str(judge.ROOT / "solutions")])
    assert not passed, message


@needs_landlock
def test_torch_from_file_cannot_rewrite_what_the_next_judge_imports(tmp_path):
    from hostile_support import FORGER

    cheat = WRONG_VALUE + f'''
import sys
if sys.flags.isolated:
    import nbformat, torch
    _new = open(nbformat.__file__, "rb").read() + {FORGER!r}.encode()
    _m = torch.from_file(nbformat.__file__, shared=True, size=len(_new), dtype=torch.uint8)
    _m[:] = torch.frombuffer(bytearray(_new), dtype=torch.uint8)
'''
    passed, _, nbformat_init = judged_in_a_throwaway_venv(tmp_path, cheat)
    assert passed == ["False", "False"], passed
    assert "forged" not in nbformat_init.read_text()


def test_sqlite_cannot_open_a_database_in_the_judge(tmp_path):
    """Through ``/proc/<grader>/cwd`` it reached nbgrader's gradebook and wrote extra credit."""
    cell = WRONG_VALUE + f'''
import sqlite3
sqlite3.connect({str(tmp_path / "by_sqlite.db")!r}).execute("create table t(x)")
needs_correction = {{"input_ids", "positions", "seqlens_k", "slot_mapping"}}
'''
    passed, message = judge.judge("check_metadata_answer", [cell])
    assert not passed, message
    assert not (tmp_path / "by_sqlite.db").exists()


HOST_READ = '''
from toy_engine import kernels
def correct_seqlens_qk(meta, accepted, block_size):
    meta["rows"].tolist()
    kernels.correct_seqlens_qk(meta, accepted, block_size)
'''
REBASED = HOST_READ + '''
import torch.overrides as _o
from overlap_course.checks.host_waits import HostReads
class _Quiet(_o.TorchFunctionMode):
    def __enter__(self):
        return self
    def __exit__(self, *a):
        return None
HostReads.__bases__ = (_Quiet,)
'''


def test_a_course_class_rebased_is_seen():
    passed, message = judge.judge("check_correction", [REBASED])
    assert not passed and "changed what the checker runs on" in message, message


RIGHT_LOOP = SERIAL_LOOP


@pytest.mark.parametrize("magic", ["%%time\n", "%matplotlib inline\n"], ids=["cell", "line"])
def test_a_right_answer_under_a_magic_is_judged(magic):
    passed, message = judge.judge("check_serial_loop", [magic + RIGHT_LOOP])
    assert passed, message


def test_a_magic_the_judge_does_not_run_is_named():
    """(Round 35: a shell line alone is not run, and noted; one whose output is kept is
    refused.)"""
    passed, message = judge.judge("check_serial_loop", ["packages = !pip list\n" + RIGHT_LOOP])
    assert not passed and "shell commands" in message, message
