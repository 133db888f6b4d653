"""The timeline exercise 02(b)'s answer is given: the run's own, on which the timeline's
``device_idle_fraction`` -- the computation the exercise asks the answer to write -- does not
run, however the answer calls it."""

from __future__ import annotations

import sys

from toy_engine.timeline import Timeline

from .verdict import Verdict, fails


class BuiltInRan(Exception):
    """The timeline's own ``device_idle_fraction`` ran on a timeline an answer was given."""


def built_in() -> Verdict:
    return fails("built_in", "your idle_fraction calls the timeline's own "
                             "`device_idle_fraction()`: the exercise asks you to compute it "
                             "yourself, idle / (idle + busy) from timeline.device_gaps() and "
                             "timeline.device_busy_ms()")


class Given(Timeline):
    """A timeline an idle_fraction answer is given, on which the method the exercise asks the
    answer to write itself does not run, however it is called (grading round 44: `return
    timeline.device_idle_fraction()` scored 2 of 2; round 46: `Timeline.device_idle_fraction(
    timeline)` and `super()` did): that method reads the device lane first."""

    def lane(self, lane: str) -> list:
        # the built-in's own frame, or a copy of its code (grading round 47: `code.replace()`)
        if sys._getframe(1).f_code.co_code == _IDLE_FRACTION.co_code:
            raise BuiltInRan
        return super().lane(lane)

    def __setattr__(self, name: str, value) -> None:
        """Its class stays (grading round 47: `timeline.__class__ = te.Timeline` then the
        built-in scored 2 of 2)."""
        if name == "__class__":
            raise BuiltInRan
        super().__setattr__(name, value)


_IDLE_FRACTION = Timeline.device_idle_fraction.__code__
