"""Measurement: the bench, the machine report, the contention meter.

Importing it starts the contention meter's watch: a machine snapshot around every engine run."""

from .contention import watch_runs

watch_runs()
