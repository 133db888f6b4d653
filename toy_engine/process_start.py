"""How the CPU stand-in's device process is started: ``forkserver`` or ``spawn``, never ``fork``.

Whichever method, the child never re-runs the learner's ``__main__`` (``without_main_module``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import sys

START_METHOD_ENV = "TOY_ENGINE_START_METHOD"


def start_method() -> str:
    """How the device process is started: ``forkserver`` on Linux, ``spawn`` on Windows and macOS.

    A forkserver that has already imported torch forks each device process, so an engine
    starts several times faster than under spawn, which imports torch afresh in every
    device process (timings: docs/measurements/device.md).  forkserver does not exist on
    Windows, and on macOS Python itself defaults to spawn because forking a process that
    loaded system libraries (Accelerate, libomp: what torch loads) can crash the child.
    CI runs the device and engine tests under both.  ``TOY_ENGINE_START_METHOD=spawn``
    (or ``forkserver``) overrides the choice; it is read at every engine start.  ``fork``
    is refused: forking a process in which torch has already run threads can deadlock.
    """
    chosen = os.environ.get(START_METHOD_ENV, "").strip().lower()
    available = mp.get_all_start_methods()
    if not chosen:
        return "forkserver" if sys.platform != "darwin" and "forkserver" in available else "spawn"
    usable = [m for m in ("forkserver", "spawn") if m in available]
    if chosen not in usable:
        why = " (fork after torch has run can deadlock)" if chosen == "fork" else ""
        raise ValueError(f"{START_METHOD_ENV}={chosen!r} is not a start method the device process can "
                         f"use here{why}; set it to one of {usable}, or unset it for the automatic choice")
    return chosen


def mp_context(preload: list[str]):
    """The multiprocessing context of the chosen start method.  A forkserver imports the
    modules ``preload`` names when it starts, so each process it forks has them already."""
    ctx = mp.get_context(start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(preload)
    return ctx


@contextlib.contextmanager
def without_main_module():
    """Start children without re-running the user's ``__main__``.

    spawn and forkserver children normally re-import the parent's main script (so a
    script without an ``if __name__ == "__main__"`` guard would run again in the device
    process, and under spawn start another engine there).  The device process never
    needs it: kernels defined there arrive by value via cloudpickle.
    """
    original = mp_spawn.get_preparation_data

    def preparation_data(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = preparation_data
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = original
