"""Every check the notebooks and exercises call: ``from overlap_course import checks``."""

import overlap_course.measure  # noqa: F401  (the contention meter watches the runs checks make)

from .exercises import *  # noqa: F401,F403
from .exercises import __all__ as _exercises
from .notebooks import *  # noqa: F401,F403
from .notebooks import __all__ as _notebooks

__all__ = [*_exercises, *_notebooks]
