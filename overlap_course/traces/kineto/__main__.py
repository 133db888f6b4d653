"""``python -m overlap_course.traces.kineto``: see :mod:`.cli`."""

from overlap_course.command_line import run

from .cli import PROG, main

run(PROG, main)
