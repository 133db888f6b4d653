"""Every check the notebooks and exercises call: ``from overlap_course import checks``, then
``checks.check_...(...)``.

A lesson's checks live in ``lessonNN.py`` -- the notebook's questions and its exercise's
checkers side by side; a new check goes there, decorated with ``harness.notebook_check`` (an
answer) or ``harness.exercise_check`` (learner's code run on the shared engines), returning a
``verdict.Verdict`` whose category is listed in ``verdict.CATEGORIES``.  Answers are read with
``answers``, the notebook's other arguments (timeline, engine, round, ...) with ``context.given``;
exercise checkers share ``pool`` (engines), ``learner_code`` (running the learner's
code), ``host_order`` (the run's order of stages and its rules) and ``sandbox`` (time limit,
restoring what a cell patched).
"""

import overlap_course.measure  # noqa: F401  (the contention meter watches the runs checks make)

from . import (lesson00, lesson01, lesson02, lesson03, lesson04, lesson05, lesson06, lesson07,
               lesson07b)
from .lesson00 import *  # noqa: F401,F403
from .lesson01 import *  # noqa: F401,F403
from .lesson02 import *  # noqa: F401,F403
from .lesson03 import *  # noqa: F401,F403
from .lesson04 import *  # noqa: F401,F403
from .lesson05 import *  # noqa: F401,F403
from .lesson06 import *  # noqa: F401,F403
from .lesson07 import *  # noqa: F401,F403
from .lesson07b import *  # noqa: F401,F403
from .pool import close_engines
from .verdict import Verdict

__all__ = ["Verdict", "close_engines", *(name for lesson in (lesson00, lesson01, lesson02, lesson03, lesson04,
                                                            lesson05, lesson06, lesson07, lesson07b)
                                          for name in lesson.__all__)]
