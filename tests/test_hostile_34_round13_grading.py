"""Issue 34, round thirteen, grading: a wrong serial loop passed in the judge after a cell above
it filled the checker's own reference cache with that loop (a name swapped for one call, then
put back); a ``%%timeit`` cell's names overwrote the cells' (IPython keeps them local) and a
``%%time`` cell gave no value to ``_`` (IPython gives its last expression's); and after
IPython's ``%reset`` a check that starts an engine raised AttributeError (``__main__`` without
``__spec__``).  Each failed when written."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


from overlap_course.build import judge
from overlap_course.build.judge_cells import run_cells

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine


# ---- (1) the checker's caches are emptied after the cells --------------------------------------


_POISON = '''
from toy_engine import loops as _loops
from overlap_course.checks import pool as _pool
_real = _loops.serial_loop
_loops.serial_loop = serial_loop          # for one call of the checker's own reference
try:
    _pool.reference.cache_clear()
    _pool.reference(); _pool.reference(second=True)
finally:
    _loops.serial_loop = _real            # every name as the judge marked it
'''


def test_a_reference_cache_filled_by_the_cells_with_a_wrong_loop_does_not_pass_it():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, _POISON])
    assert passed is False, message
    assert "differs from the reference" in message


def test_a_right_loop_after_a_cell_that_fills_the_caches_still_passes():
    needs_the_engine()
    fills = ("from overlap_course.checks import pool\n"
             "pool.reference(); pool.reference(second=True); pool.endings_reference()\n")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP, fills])
    assert passed is True, message


def test_forget_caches_empties_the_checkers_caches_and_keeps_the_submissions():
    from overlap_course.build.judge_keep import forget_caches
    from overlap_course.checks import sandbox
    space: dict = {}
    exec(compile("import functools\n@functools.lru_cache\ndef mine(x):\n    return [x]\n",
                 "<submission cell 1>", "exec"), space)
    space["mine"](1)
    sandbox._is_learners("<submission cell 1>")
    sandbox._is_learners.cache_clear = lambda: None  # its own attribute: not what is called
    try:
        forget_caches(lambda code: code.co_filename.startswith("<submission"))
    finally:
        del sandbox._is_learners.cache_clear
    assert sandbox._is_learners.cache_info().currsize == 0
    assert space["mine"].cache_info().currsize == 1


# ---- (2) %%timeit and %%time run as IPython runs them ------------------------------------------

_RIGHT = ('[("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2), '
          '("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]')


def test_a_timeit_cell_keeps_its_names_local_as_ipythons_template():
    space, notes = run_cells([f"order = {_RIGHT}",
                              "%%timeit -n 1 -r 1 setup_name = 1\n"
                              "order = [('forward', setup_name)]\nmade = 2\n",
                              "%timeit -n1 -r1 line_name = 3"])
    assert not notes
    assert space["order"] == eval(_RIGHT)
    assert not {"made", "setup_name", "line_name"} & space.keys()


def test_a_timeit_cell_with_a_bare_return_is_an_error_as_in_ipython():
    _, notes = run_cells(["%%timeit\nreturn 1\n"])
    assert notes and "SyntaxError" in notes[0]


def test_a_time_cells_last_value_is_its_out_and_underscore():
    space, notes = run_cells([f"%%time\n{_RIGHT}", "order = _", "%%time\nx = 1\nx + 1",
                              "two = _", "%time a = 5; a * 2", "ten = _",
                              "%%time\n3;", "still = _"])
    assert not notes
    assert space["order"] == eval(_RIGHT)
    assert space["two"] == 2 and space["ten"] == 10 and space["still"] == 10
    assert space["Out"] == {1: eval(_RIGHT), 3: 2, 5: 10}
    assert space["a"] == 5 and space["x"] == 1


def test_a_statement_after_percent_percent_time_is_refused_as_ipython_refuses_it():
    _, notes = run_cells(["%%time x = 1\ny = 2\n"])
    assert notes and "%%time" in notes[0]


def test_the_judge_passes_the_right_order_under_the_time_magics():
    needs_the_engine()
    for cells in ([f"order = {_RIGHT}", "%%timeit -n 1 -r 1\norder = [('forward', 1)]\n"],
                  [f"%%time\n{_RIGHT}", "order = _"]):
        passed, message = judge.judge("check_three_rounds",
                                      ["from overlap_course import checks", *cells])
        assert passed is True, (cells, message)


# ---- (3) a device process starts whatever __main__ a notebook left --------------------------

_ODD_MAINS = textwrap.dedent('''
    import sys, multiprocessing.spawn as spawn
    from toy_engine.process_device import without_main_module
    class Reset:  # IPython's user module after %reset: no __spec__
        pass
    for odd in (Reset(), "a string", None):
        sys.modules["__main__"] = odd
        with without_main_module():
            data = spawn.get_preparation_data("x")
        assert sys.modules["__main__"] is odd, odd
        assert "init_main_from_name" not in data and "init_main_from_path" not in data
    del sys.modules["__main__"]
    with without_main_module():
        spawn.get_preparation_data("x")
    assert "__main__" not in sys.modules
    print("ok")
''')


def test_the_device_process_data_is_read_whatever_main_holds():
    out = subprocess.run([sys.executable, "-c", _ODD_MAINS], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(judge.ROOT)})
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


_RESET = textwrap.dedent('''
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_cell("%reset -f")
    shell.run_cell("from overlap_course import checks")
    r = shell.run_cell("v = checks.check_three_rounds([('forward', 1)])")
    print(type(r.error_in_exec).__name__, shell.user_ns.get("v") is not None)
''')


def test_a_check_after_percent_reset_gives_a_verdict():
    out = subprocess.run([sys.executable, "-c", _RESET], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(judge.ROOT)})
    assert out.stdout.strip().splitlines()[-1:] == ["NoneType True"], out.stdout[-2000:]
