"""Measurement: the bench, the machine report, the contention meter.

Importing it starts the contention meter's watch: a machine snapshot around every engine run."""

import sys

from overlap_course.command_line import interruptible

# `python -m overlap_course.measure.bench` imports this package, and torch with it, before the
# bench's first line; sys.argv[0] is "-m" while Python locates that module (its documented
# value then).  The bench is the package's one command.
interruptible("__main__" if sys.argv[:1] == ["-m"] else __name__,
              "python -m overlap_course.measure.bench")

from .contention import watch_runs  # noqa: E402 - after the line above, which must come first

watch_runs()
