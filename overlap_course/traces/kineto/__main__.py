"""``python -m overlap_course.traces.kineto``: see :mod:`.cli`."""

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "python -m overlap_course.traces.kineto")  # first: see ctrl_c

from overlap_course.command_line import run  # noqa: E402

from .cli import PROG, main  # noqa: E402

run(PROG, main)
