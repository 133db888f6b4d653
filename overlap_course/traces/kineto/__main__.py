"""``python -m overlap_course.traces.kineto``: see :mod:`.cli`."""

from overlap_course.command_line import interruptible, run

interruptible(__name__, "python -m overlap_course.traces.kineto")  # first: see command_line

from .cli import PROG, main

run(PROG, main)
