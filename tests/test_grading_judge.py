"""The grading command's edges, and the judge's parts that need no nbgrader run (the judge
under real ``nbgrader autograde`` is tests/test_grading.py's cheat test)."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from overlap_course.build import grading, judge, judge_process


def _grading(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "overlap_course.build.grading", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_an_unknown_exercise_is_named_with_the_valid_ones(tmp_path):
    done = _grading("course", str(tmp_path / "c"), "04_seqlen_correction", "99_no_such_exercise")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "'99_no_such_exercise'" in done.stderr
    assert all(name in done.stderr for name in grading.POINTS)
    assert not (tmp_path / "c").exists()  # nothing half made


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_a_dest_that_cannot_be_a_folder_is_one_line(tmp_path, where):
    (tmp_path / "f").write_text("x")
    dest = tmp_path / "f" if where == "file" else tmp_path / "f" / "course"
    done = _grading("course", str(dest))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and str(dest) in done.stderr


def test_values_cross_as_plain_data_only():
    answer = {"a": [(1, 2.5), {"x"}, frozenset({None, True})], "n": 10 ** 400}
    assert judge_process._decode(judge_process._encode(answer)) == answer

    class Everything(set):
        def __eq__(self, other):
            return True

    deep = [1]
    for _ in range(30):
        deep = [deep]
    for odd in (Everything(), {"seqlens_k": object()}, deep):
        with pytest.raises(ValueError):
            judge_process._encode(odd)


def test_the_fingerprint_names_a_replaced_checker_function():
    import overlap_course.checks.lesson04 as lesson04

    before = judge_process._fingerprint()
    real = lesson04.fails
    lesson04.fails = lambda *a, **k: None
    try:
        changed = judge_process._compare(before, judge_process._fingerprint())
    finally:
        lesson04.fails = real
    assert changed == ["overlap_course.checks.lesson04.fails"]
    assert judge_process._compare(before, judge_process._fingerprint()) == []


def test_a_changed_installation_grades_nothing(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "checks.check_metadata_answer(needs_correction)",
        metadata={"nbgrader": {"grade": True, "grade_id": "check_metadata_answer", "points": 2}})])
    pristine = judge.installed_digest()
    some = next(iter(pristine))
    judge.judge_notebook(nb, {**pristine, some: "0" * 64})
    [out] = nb.cells[0].outputs
    assert out.output_type == "error" and some in out.evalue and "not graded" in out.evalue


def test_the_judges_own_run_is_the_one_the_notebook_makes():
    """The judge replaces a context argument by its own run (CONTEXT_RUNS): that run must be
    the notebook's cell, or a right answer would be judged on another engine than the
    learner's."""
    run = grading.CONTEXT_RUNS["engine"]
    config = ", ".join(f"{key}={value!r}".replace("'", '"') for key, value in run["config"].items())
    call = (f"engine.generate({run['prompts']!r}, max_new_tokens={run['max_new_tokens']})"
            .replace("'", '"'))
    for folder in ("source", "solutions", "exercises"):
        nb = nbformat.read(grading.ROOT / folder / "02_serial_loop.ipynb", as_version=4)
        made = [c.source for c in nb.cells if c.cell_type == "code" and "engine = te.Engine(" in
                c.source]
        assert made and f"engine = te.Engine(te.EngineConfig({config}))" in made[0], made
        assert f"outs = {call}" in made[0], (call, made[0])
