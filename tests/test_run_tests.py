"""``./run.sh test`` (scripts/run_tests.py): which arguments keep one pytest run, what runs
alone, and the longest files first."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_course.build import landlock

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_tests = _load("run_tests", ROOT / "scripts" / "run_tests.py")
LONGEST_FIRST = _load("root_conftest", ROOT / "conftest.py").LONGEST_FIRST


@pytest.mark.parametrize("args, named", [
    ([], False), (["-p", "no:cacheprovider", "--durations=25"], False), (["-k", "zos"], False),
    (["-q", "-x"], False), (["tests/test_zos.py"], True), (["tests/test_zos.py::test_x"], True),
    (["notebooks"], True), (["-m", "alone"], True), (["-n", "4"], True), (["-nauto"], True),
    (["-p", "no:xdist"], True), (["-pno:xdist"], True), (["--dist=load"], True),
    (["--maxprocesses=2"], True), (["--tx", "popen"], True), (["--max-worker-restart=1"], True),
    (["-k", " or ".join(f"test_case_number_{i}" for i in range(15))], False)])
def test_arguments_that_name_tests_or_workers_keep_one_pytest_run(args, named, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert run_tests.names_tests(args) is named


# Both collections in one interpreter, one ``pytest.main`` each: the second finds the test modules
# imported (one collection of tests/ took 11 s on a quiet core, both 11.2 s; 26 s and 35 s in CI).
_COLLECT = """import json, sys, pytest
for args in json.loads(sys.argv[1]):
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args])
    print(f"\\n{sys.argv[2]} {int(code)}", flush=True)
"""
_RUNS = (("tests",), ("-m", "alone", "tests"))
_END = "=== end of one collection, exit code:"


@functools.cache
def _collections() -> dict:
    out = subprocess.run([sys.executable, "-c", _COLLECT, json.dumps(_RUNS), _END], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    pieces = out.stdout.split(f"\n{_END} ")
    parts, codes = pieces[:-1], [piece.partition("\n")[0].strip() for piece in pieces[1:]]
    assert out.returncode == 0 and codes == ["0"] * len(_RUNS), (
        out.stdout[-2000:] + out.stderr[-2000:])
    return {args: [line for line in part.splitlines() if "::" in line]
            for args, part in zip(_RUNS, parts)}


def _collected(*args: str) -> list[str]:
    return _collections()[args]


def test_the_longest_files_are_collected_first_in_their_order():
    assert all((ROOT / name).is_file() for name in LONGEST_FIRST), "a file was renamed: update it"
    files = list(dict.fromkeys(node.partition("::")[0] for node in _collected("tests")))
    assert files[:len(LONGEST_FIRST)] == LONGEST_FIRST


def test_what_runs_alone_measures_the_machine_or_writes_beside_the_course():
    alone = set(_collected("-m", "alone", "tests"))
    hub = {node for node in alone if node.startswith("tests/browser/test_jupyterhub.py::")}
    cheats = set() if landlock.abi() else {  # fenced, it writes nothing beside the course
        "tests/test_grading.py::test_a_submission_cannot_grade_itself"}
    assert hub and alone - hub == cheats | {
        "tests/test_machine.py::test_under_a_cpu_burner_the_bench_and_the_figures_warn_and_show_"
        "the_recorded_run",
        "tests/browser/test_voila.py::test_explorer_app_at_1280x720_fast_on_screen_titled_and_named",
        "tests/browser/test_voila.py::test_explorer_app_busy_note_is_one_line"}, sorted(alone)
