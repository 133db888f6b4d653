"""``python -m overlap_course.traces.kineto``: see :mod:`.cli`."""

import sys

from .cli import main

sys.exit(main())
