"""Loaded for every test run, tests/ and the nbval notebooks alike."""

import os
import tempfile

# Every check records its verdict (overlap_course/progress.py): the tests and nbval's kernels (they
# inherit this environment) write to a throw-away record, never the tester's own progress.
os.environ.setdefault("OVERLAP_PROGRESS_FILE",
                      os.path.join(tempfile.mkdtemp(prefix="overlap-progress-"), "progress.jsonl"))
