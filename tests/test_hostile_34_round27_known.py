"""Issue 34, round twenty-seven: the two right loops round 26 left failed by the judge.  A loop
that shows a ``tqdm`` bar (tqdm's monitor thread outlived the bar: "a thread your code started
still running") and one that prints from a finalizer (``weakref.finalize(step, print, ...)``:
"C code ... with no code of yours to compare").  tqdm's monitor is off in the judge; ``print``
given plain values is harmless while the standard streams are Python's own, and each way
around those rules is still a change."""

from __future__ import annotations

from overlap_course.build import judge

from judged import IMPORTS, needs_the_engine
from test_hostile_34_round25_judge import CHANGED, _wrong

_LOOP = '''
def serial_loop(engine):
    {setup}
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        {late}
        engine.device.wait(step.sample_done)
        engine.process_outputs(step)
        {after}
'''


def _loop(top: str = "", setup: str = "pass", late: str = "pass", after: str = "pass") -> str:
    return top + _LOOP.format(setup=setup, late=late, after=after)


BAR = _loop("from tqdm.auto import tqdm\n", setup="bar = tqdm(desc='rounds', leave=False)",
            after="bar.update()")
PRINTS = _loop("import weakref\n",
               late='weakref.finalize(step, print, "freed", (1, 2.0), None, sep=" | ")')


def test_a_right_loop_showing_a_tqdm_bar_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, BAR])
    assert passed is True, message


def test_a_right_loop_printing_from_a_finalizer_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, PRINTS])
    assert passed is True, message


def test_a_bar_monitor_turned_back_on_is_a_thread_still_running():
    needs_the_engine()
    cell = BAR.replace("from tqdm.auto import tqdm\n",
                       "import tqdm.std as bars\nfrom tqdm.auto import tqdm\n"
                       "bars.tqdm.monitor_interval = 10\n")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell])
    assert not passed and CHANGED in message and "still running" in message, message


# round 24's late break and mend, each through print: the cells' stream writes with C code that
# rebinds pool.compare (max applies its key to the list first, then fails on the printed text)
THROUGH_A_STREAM = _wrong('''
import sys, types
''', '''
sys.stdout = types.SimpleNamespace(write=MEND, flush=int)
sys.stderr = types.SimpleNamespace(write=BREAK, flush=int)
weakref.finalize(watch, print, "mended")
weakref.finalize(local, print, "broken", file=None)
''')


def test_print_to_a_stream_the_cells_made_is_a_change():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, THROUGH_A_STREAM])
    assert not passed and CHANGED in message, message
    assert "a finalizer calling print" in message and "standard stream" in message, message


# round 27b: Python's own stream type around a buffer of the cells', whose write is C code
# that rebinds pool.compare; stderr (where the breaking print's error is reported) swaps stdout
THROUGH_A_WRAPPER = _wrong('''
import sys, types, io
def _buf(write):
    return types.SimpleNamespace(write=write, flush=int, closed=False,
                                 readable=functools.partial(bool, 0),
                                 writable=functools.partial(bool, 1),
                                 seekable=functools.partial(bool, 0))
MENDS = io.TextIOWrapper(_buf(MEND), write_through=True)
SWAP = io.TextIOWrapper(_buf(functools.partial(max, [("stdout", MENDS)], key=vars(sys).update)),
                        write_through=True)
sys.stdout = io.TextIOWrapper(_buf(BREAK), write_through=True)
sys.stderr = SWAP
''', '''
weakref.finalize(watch, print, "mended")
weakref.finalize(local, print, "broken")
''')


def test_print_to_pythons_own_stream_type_around_the_cells_buffer_is_a_change():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, THROUGH_A_WRAPPER])
    assert not passed and CHANGED in message and "standard stream" in message, message


def test_print_given_what_is_not_plain_is_a_change():
    needs_the_engine()
    cell = PRINTS.replace('"freed", (1, 2.0), None', "engine")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell])
    assert not passed and "a finalizer calling print (C code given a" in message, message


def test_a_del_handed_its_instance_is_plain_only_where_it_is_stored():
    """``__del__ = LIVE.remove`` compares the instance with the items: its class's ``__eq__``
    (C code the cells chose) runs; ``LIVE.append`` only stores it."""
    from test_hostile_34_round25_judge import _looked

    mine = lambda: {"list": [1, 2]}  # noqa: E731 - the cells' own list
    assert _looked(mine, lambda m: [type("Kept", (), {"__del__": m["list"].append})]) == []
    assert _looked(mine, lambda m: [type("Gone", (), {"__del__": m["list"].remove})]) == [
        "a class Gone whose __del__ is list.remove (C code given a Gone: only numbers, strings, "
        "None and tuples of them are plain)"]
