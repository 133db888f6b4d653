"""The course's figures: ``from overlap_course import figures``."""

from .viz import *  # noqa: F401,F403
from .viz import __all__  # noqa: F401
