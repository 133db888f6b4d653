"""Issue 34's sixth hostile round, the judge: each passed a wrong answer before its fix.  A
check's wrapper changed through its closure cell; the solution read, or site-packages written,
through ``readline``'s history files (C, no audit event); the solution copied to ``/tmp`` by
the learner's kernel (which runs the cells first, unguarded) and read there by the judge; and
a venv's ``bin/python`` (a link) replaced by a script that signs a pass for every later judge."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hostile_support import FORGER, SERIAL_LOOP, WRONG_VALUE, judged_in_a_throwaway_venv
from overlap_course.build import judge

ZOS = '''
import toy_engine as te
def serial_loop(engine):
    te.loops.zos_loop(engine)
'''

CLOSURE_CELL = ZOS + '''
from overlap_course import checks
from overlap_course.checks.verdict import passes

def _lenient(*args, **kwargs):
    return passes("the serial loop reproduces the reference")

_f = checks.check_serial_loop
_f.__closure__[_f.__code__.co_freevars.index("check")].cell_contents = _lenient
'''

READLINE_READS_THE_SOLUTION = ZOS + '''
import json, os, readline
import overlap_course
_root = os.path.dirname(os.path.dirname(overlap_course.__file__))
readline.clear_history()
readline.read_history_file(os.path.join(_root, "solutions", "02_serial_loop.ipynb"))
_text = "\\n".join(readline.get_history_item(i)
                   for i in range(1, readline.get_current_history_length() + 1))
for _cell in json.loads(_text)["cells"]:
    _src = "".join(_cell["source"])
    if _cell["cell_type"] == "code" and "def serial_loop(" in _src:
        exec(_src)
'''

# The kernel (no guard) copies the solution's answer cell to DROP; the judge runs the same cell.
DROP = Path(tempfile.gettempdir()) / f"overlap-round6-smuggled-{os.getpid()}.py"
SMUGGLED = ZOS + f'''
import json, pathlib
import overlap_course
_drop = pathlib.Path({str(DROP)!r})
_solution = pathlib.Path(overlap_course.__file__).parents[1] / "solutions" / "02_serial_loop.ipynb"
try:
    _cells = json.loads(_solution.read_text())["cells"]
    _drop.write_text("\\n".join("".join(c["source"]) for c in _cells if c["cell_type"] == "code"
                                and "def serial_loop(" in "".join(c["source"])))
except OSError:
    pass
if _drop.exists():
    exec(_drop.read_text())
'''


def _not_passed(check: str, cell: str, **kwargs) -> str:
    passed, message = judge.judge(check, [cell], **kwargs)
    assert not passed, message
    return message


def test_a_checks_closure_cell_swapped_is_seen():
    assert "changed what the checker runs on" in _not_passed("check_serial_loop", CLOSURE_CELL)


def test_readline_cannot_read_the_solution_in_the_judge():
    _not_passed("check_serial_loop", READLINE_READS_THE_SOLUTION,
                private=[str(judge.ROOT / "solutions")])  # the cell's error: the ZOS loop judged


def test_a_file_the_kernel_left_is_not_read_by_the_judge():
    try:
        kernel = subprocess.run([sys.executable, "-c", SMUGGLED], capture_output=True, text=True,
                                timeout=300, cwd=tempfile.gettempdir(),
                                env={**os.environ, "PYTHONPATH": str(judge.ROOT)})
        assert kernel.returncode == 0 and DROP.exists(), kernel.stderr[-500:]
        _not_passed("check_serial_loop", SMUGGLED, private=[str(judge.ROOT / "solutions")])
    finally:
        DROP.unlink(missing_ok=True)


def test_control_a_right_loop_still_passes_with_the_new_guards():
    passed, message = judge.judge("check_serial_loop", [SERIAL_LOOP])
    assert passed, message


READLINE_WRITES_A_MODULE = WRONG_VALUE + f'''
import sys
if sys.flags.isolated:
    import nbformat, readline
    lines = open(nbformat.__file__).read().splitlines() + {FORGER!r}.splitlines()
    readline.clear_history()
    for line in lines:
        readline.add_history(line)
    readline.write_history_file(nbformat.__file__)
'''
REPLACES_THE_INTERPRETER = WRONG_VALUE + f'''
import os, sys
exe = sys.executable
if sys.flags.isolated and os.path.islink(exe):
    real = os.path.realpath(exe)
    os.remove(exe)
    with open(exe, "w") as f:
        f.write("#!" + real + " -I\\n" + {FORGER!r})
    os.chmod(exe, 0o755)
'''


@pytest.mark.parametrize("cheat", [READLINE_WRITES_A_MODULE, REPLACES_THE_INTERPRETER],
                         ids=["readline-writes-nbformat", "bin-python-replaced"])
def test_a_judge_cannot_change_what_the_next_judge_runs(cheat, tmp_path):
    passed, python, nbformat_init = judged_in_a_throwaway_venv(tmp_path, cheat)
    assert passed == ["False", "False"], passed
    assert python.is_symlink()
    assert "forged" not in nbformat_init.read_text()
