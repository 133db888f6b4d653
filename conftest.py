"""Loaded for every test run, tests/ and the nbval notebooks alike."""

import os
import tempfile

# Every check records its verdict (overlap_course/progress.py): the tests and nbval's kernels (they
# inherit this environment) write to a throw-away record, never the tester's own progress.
os.environ.setdefault("OVERLAP_PROGRESS_FILE",
                      os.path.join(tempfile.mkdtemp(prefix="overlap-progress-"), "progress.jsonl"))

# ./run.sh test gives whole files to two workers (scripts/run_tests.py) in the order collected: the
# longest start first, or the run ends on one long file with the other worker idle.  Longest first,
# by their seconds in a serial run of the suite (2 cores, 2026-12-04, beside other work).
LONGEST_FIRST = ["tests/test_grading.py",                      # 418 s
                 "tests/test_grading_guard.py",                # 103 s
                 "tests/test_plain_install.py",                # 101 s
                 "tests/test_blind_corpus.py",                 # 82 s
                 "tests/test_hostile_34_round7_judge.py",      # 79 s
                 "tests/test_hostile_34_round3.py",            # 69 s
                 "tests/test_hostile_34_round6_judge.py",      # 59 s
                 "tests/test_hostile_34_round4_files.py",      # 55 s
                 "tests/test_hostile_34_round6.py",            # 49 s
                 "tests/test_hostile_34.py",                   # 47 s
                 "tests/test_hostile_34_round4.py",            # 45 s
                 "tests/test_mistakes.py",                     # 44 s
                 "tests/test_run_sh.py"]                       # 42 s


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
