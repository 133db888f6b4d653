"""Measurement: the bench, the machine report, the contention meter.

Importing it starts the contention meter's watch: a machine snapshot around every engine run.
(``python -m overlap_course.measure.bench`` imports it, and torch with it, before the bench's
first line: ``overlap_course.ctrl_c`` has Ctrl-C from the package's ``__init__`` on.)"""

from .contention import watch_runs

watch_runs()
