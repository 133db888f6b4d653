"""How the CPU stand-in's device process is started: ``forkserver`` or ``spawn``, never ``fork``.

Whichever method, the child never re-runs the learner's ``__main__`` (``without_main_module``).
"""

import contextlib
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import sys

START_METHOD_ENV = "TOY_ENGINE_START_METHOD"


def start_method() -> str:
    """``forkserver`` on Linux (torch imported once: several times faster, docs/measurements/device.md),
    else ``spawn`` (Windows has no forkserver; on macOS it can crash).  ``TOY_ENGINE_START_METHOD``
    overrides it; ``fork`` is refused: forking after torch has run threads can deadlock."""
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
    """The chosen start method's context; a forkserver imports ``preload`` once for all its children."""
    ctx = mp.get_context(start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(preload)
    return ctx


@contextlib.contextmanager
def without_main_module():
    """Start children without re-importing the user's main script (unguarded, it starts an engine)."""
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
