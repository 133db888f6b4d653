"""The exercises as a real nbgrader course (overlap_course/build/grading.py): the sources carry nbgrader's
metadata, the shipped notebooks do not, and nbgrader 0.9's own generate_assignment and
autograde grade a right and a wrong submission of two exercises with the course's checkers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from overlap_course.build import notebooks as course
from overlap_course import progress
from overlap_course.build import grading, landlock

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = ("02_serial_loop", "04_seqlen_correction")
# One wrong answer per exercise; the other answer right, so the grades show points per check.
WRONG_ANSWERS = {
    "02_serial_loop": ("serial_loop", '''\
def serial_loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.launch_sample(inputs)  # the step is never waited for nor processed
'''),
    "04_seqlen_correction": ("needs_correction", 'needs_correction = {"seqlens_k", "positions", "seqlens_q"}\n'),
}
EXPECTED = {  # student -> assignment -> {grade cell: score}
    "right": {"02_serial_loop": {"check_serial_loop": 3, "check_idle_fraction": 2},
              "04_seqlen_correction": {"check_correction": 4, "check_metadata_answer": 2}},
    "wrong": {"02_serial_loop": {"check_serial_loop": 0, "check_idle_fraction": 2},
              "04_seqlen_correction": {"check_correction": 4, "check_metadata_answer": 0}},
}


def test_sources_carry_nbgrader_metadata_and_points_per_check():
    assert grading.check() == []
    for src in sorted((ROOT / "source").glob("*.ipynb")):
        nb = nbformat.read(src, as_version=4)
        meta = [c.metadata["nbgrader"] for c in nb.cells if "nbgrader" in c.metadata]
        graded = {m["grade_id"]: m["points"] for m in meta if m["grade"]}
        assert graded == grading.POINTS[src.stem]
        assert all(m["locked"] for m in meta if m["grade"])
        solutions = [c for c in nb.cells if "### BEGIN SOLUTION" in c.source]
        assert solutions and all(c.metadata["nbgrader"]["solution"] for c in solutions)


def test_a_missing_grade_cell_is_reported(tmp_path):
    (tmp_path / "source").mkdir()
    nb = nbformat.read(ROOT / "source" / "04_seqlen_correction.ipynb", as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    nbformat.write(nb, tmp_path / "source" / "04_seqlen_correction.ipynb")
    assert any("out of date" in p for p in grading.check(tmp_path))


def test_the_shipped_notebooks_carry_no_nbgrader_metadata():
    """Self-paced learners get exercises/ and solutions/ as before: no locked cells, no grade ids."""
    for src, ex, sol in course.targets():
        source_nb = nbformat.read(src, as_version=4)
        for path, keep in ((ex, False), (sol, True)):
            for nb in (nbformat.read(path, as_version=4), course.render(source_nb, keep)):
                assert not any("nbgrader" in c.metadata for c in nb.cells), path


def _nbgrader_env() -> dict[str, str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop(progress.ENV_GRADING, None)  # the grade must not depend on the grader's environment
    return env


def _nbgrader(course_dir: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir,
                          env=_nbgrader_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"nbgrader {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout + done.stderr


def _autograde_side_by_side(runs: list[tuple[Path, str]]) -> None:
    """``nbgrader autograde`` of each (course folder, assignment) at once.  One autograde runs one kernel or
    judge at a time, so two of them on two cores take little more than one: the cheats' run
    took 311 s alone (these 2-core machines), and this spares CI about half of it."""
    started = []
    for home, assignment in runs:
        log = open(home / "autograde.log", "w+")  # a file, not a pipe: no run waits on a reader
        started.append((home, log, subprocess.Popen(
            [sys.executable, "-m", "nbgrader", "autograde", assignment, "--force"], cwd=home,
            env=_nbgrader_env(), stdout=log, stderr=subprocess.STDOUT, text=True)))
    for home, log, run in started:
        try:
            run.wait(timeout=900)
        finally:
            if run.returncode is None:
                run.kill()
                run.wait()
            log.seek(0)
            said = log.read()
            log.close()
        assert run.returncode == 0, f"nbgrader autograde in {home}:\n{said[-6000:]}"


def _submission(released, solution, wrong: tuple[str, str] | None):
    """The released notebook with its answer cells written: the solution's, one maybe wrong."""
    nb = nbformat.from_dict(released)
    sol = nbformat.read(solution, as_version=4)
    assert len(sol.cells) == len(nb.cells)
    for cell, answer in zip(nb.cells, sol.cells):
        if cell.metadata.get("nbgrader", {}).get("solution"):
            assert "NotImplementedError" in cell.source, cell.source  # generate_assignment cleared it
            cell.source = answer.source
            if wrong and cell.metadata["nbgrader"]["grade_id"] == f"answer_{wrong[0]}":
                cell.source = wrong[1]
    return nb


@pytest.mark.timeout(1500)
def test_nbgrader_generates_and_autogrades_with_the_course_checkers(tmp_path):
    pytest.importorskip("nbgrader", reason="nbgrader is in the dev extra: pip install -e '.[dev]'")
    from nbgrader.api import Gradebook

    homes = {a: grading.course(tmp_path / a, assignments=[a]) for a in ASSIGNMENTS}
    for a, home in homes.items():  # each in its own course, graded side by side below
        _nbgrader(home, "generate_assignment", a, "--force")
        released = nbformat.read(home / "release" / a / f"{a}.ipynb", as_version=4)
        # The learner's version: no line of any answer left (lines only the solution has), checkers locked.
        ex = nbformat.read(ROOT / "exercises" / f"{a}.ipynb", as_version=4)
        sol = nbformat.read(ROOT / "solutions" / f"{a}.ipynb", as_version=4)
        answers = 0
        for r, e, s in zip(released.cells, ex.cells, sol.cells, strict=True):
            if r.metadata.get("nbgrader", {}).get("solution"):
                answer = {line.strip() for line in s.source.splitlines()} - {
                    line.strip() for line in e.source.splitlines()} - {""}
                assert answer and not answer & {line.strip() for line in r.source.splitlines()}, r.source
                answers += 1
            elif r.metadata.get("nbgrader", {}).get("grade"):
                assert r.metadata["nbgrader"]["locked"] and r.source == s.source
        assert answers == 2
        for student, wrong in (("right", None), ("wrong", WRONG_ANSWERS[a])):
            folder = home / "submitted" / student / a
            folder.mkdir(parents=True)
            nbformat.write(_submission(released, ROOT / "solutions" / f"{a}.ipynb", wrong), folder / f"{a}.ipynb")
    _autograde_side_by_side([(home, a) for a, home in homes.items()])

    got = {}
    for student, by_assignment in EXPECTED.items():
        for a, cells in by_assignment.items():
            with Gradebook(f"sqlite:///{homes[a] / 'gradebook.db'}") as gb:
                got.setdefault(student, {})[a] = {
                    cell: gb.find_grade(cell, a, a, student).score for cell in cells}
                nb = gb.find_submission_notebook(a, a, student)
                assert nb.max_score == sum(grading.POINTS[a].values())
    assert got == EXPECTED
    # The feedback a learner would get names the checker's verdict, not only "0 points".
    graded = nbformat.read(homes["02_serial_loop"] / "autograded" / "wrong" / "02_serial_loop"
                           / "02_serial_loop.ipynb", as_version=4)
    errors = [o for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "check_serial_loop"
              for o in c.outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "CheckNotPassed", errors
    assert "had not been waited for and processed" in errors[0].evalue, errors
    # The right submission's own cells ran in the fenced kernel: its engine started (round 39
    # saw every engine of a grading kernel fail where the course was installed another way).
    for a in homes:
        graded = nbformat.read(homes[a] / "autograded" / "right" / a / f"{a}.ipynb", as_version=4)
        errors = [o for c in graded.cells for o in c.get("outputs", [])
                  if o.output_type == "error"]
        assert not errors, (a, errors)


def test_a_learners_lab_set_up_by_run_sh_loads_no_nbgrader_menus():
    """nbgrader is in the dev extra for CI's grading test; ./run.sh setup turns its Jupyter
    extensions off, so a self-paced learner's JupyterLab shows no instructor menus."""
    import subprocess
    import sys
    from pathlib import Path

    prefix = Path(sys.prefix)
    if not (prefix / ".run-sh-setup").exists():
        pytest.skip("this environment was not set up by ./run.sh (conda, Binder, a hub image)")
    for ext in ("@jupyter/nbgrader", "@jupyter-notebook"):  # Voila would load them (and notebook 7's breaks it)
        assert not (prefix / "share/jupyter/labextensions" / ext).exists(), ext
    listed = subprocess.run([str(prefix / "bin/jupyter"), "server", "extension", "list"], capture_output=True,
                            text=True).stderr + ""
    enabled = [line for line in listed.splitlines() if "nbgrader.server_extensions" in line and "enabled" in line]
    assert not enabled, enabled


# ------------------------------------------------------------------ a submission that grades itself

EX04 = "04_seqlen_correction"
WRONG_CORRECTION = """\
def correct_seqlens_qk(meta, accepted, block_size):
    meta["seqlens_k"] += accepted[meta["rows"]] * meta["pending"]  # positions and slots left stale
"""
WRONG_METADATA = 'needs_correction = {"seqlens_k", "positions", "seqlens_q"}\n'
SMUGGLED = Path(tempfile.gettempdir()) / "overlap-round6-smuggled-04.py"
# Each cheat: (wrong answers, a cell the learner adds above each graded cell, whether the
# learner's own kernel is fooled -- its checks pass the wrong answers, shown by a control cell).
CHEATS = {
    "environment": (("correction", "metadata"), 'import os\nos.environ["OVERLAP_GRADING"] = "0"\n',
                    False),
    "replaced_checks": (("correction", "metadata"), """\
from overlap_course.checks.verdict import passes
checks.check_correction = lambda *a, **k: passes("ok")
checks.check_metadata_answer = lambda *a, **k: passes("ok")
""", True),
    "patched_verdict": (("correction", "metadata"), """\
from overlap_course.checks import verdict as V
V.Verdict.__post_init__ = lambda self: None
V.Verdict.passed = property(lambda self: True, lambda self, value: None)
""", True),
    "fake_sys_modules": (("correction", "metadata"), """\
import sys, types
import overlap_course
from overlap_course.checks.verdict import passes
fake = types.ModuleType("overlap_course.checks")
fake.check_correction = fake.check_metadata_answer = lambda *a, **k: passes("ok")
sys.modules["overlap_course.checks"] = overlap_course.checks = checks = fake
""", True),
    "patched_builtins": (("metadata",), """\
import builtins
_set = getattr(builtins, "_real_set", builtins.set)
builtins._real_set = _set
builtins.set = lambda *a: _set({"seqlens_k", "positions", "slot_mapping", "input_ids"}) if (
    a and isinstance(a[0], list) and "seqlens_q" in a[0]) else _set(*a)
""", True),
    "patched_checker_helpers": (("correction",), """\
import overlap_course.checks.lesson04 as L
L._judge_case = lambda *a, **k: None
L._stays_on_device = lambda *a, **k: None
L.state_kept = lambda *a, **k: None
L.pool.compare = lambda *a, **k: ""
L.engine_fix = lambda *a, **k: None
""", True),
    "function_patches_when_called": (("metadata",), None, True),  # its correction does it
    "files_and_solution": (("correction", "metadata"), """\
import json, os, pathlib
import overlap_course
here = pathlib.Path("04_seqlen_correction.ipynb")
for name in os.listdir("."):
    if name != here.name:
        os.remove(name)  # whatever lay next to the notebook
solutions = [pathlib.Path("../../../source/04_seqlen_correction/04_seqlen_correction.ipynb"),
             pathlib.Path(overlap_course.__file__).parents[1] / "solutions" / here.name]
for path in solutions:
    try:
        cells = json.loads(path.read_text())["cells"]
    except OSError:
        continue
    for cell in cells:
        if "BEGIN SOLUTION" in "".join(cell["source"]):
            exec("".join(cell["source"]))  # the solution's answers, read at grading time
    here.write_text(path.read_text())  # the notebook itself rewritten as the solution
""", True),
    "self_restoring_patch": (("correction",), """\
import overlap_course.checks.lesson04 as _L
_real = (_L._judge_case, _L._stays_on_device, _L.pool.compare)
_compares = []
def _lenient_compare(*args, **kwargs):
    _compares.append(1)
    if len(_compares) % 2 == 0:  # the check's last comparison: every helper put back
        _L._judge_case, _L._stays_on_device, _L.pool.compare = _real
    return ""
_L._judge_case = lambda *a, **k: None
_L._stays_on_device = lambda *a, **k: None
_L.pool.compare = _lenient_compare
""", False),  # when a check ends all is as it was (before the judge's watch: 4 of 4); the
    # control cell runs after the last check put the helpers back, so it sees them real
    "shadow_module": (("correction", "metadata"), """\
import os
import overlap_course
root = os.path.dirname(os.path.dirname(overlap_course.__file__))
with open(os.path.join(root, "hmac.py"), "w") as f:  # where the judge looked first
    f.write(SHADOW_HMAC)
""", False),
    # Round six: the checks' wrappers changed through their closure cells (no name changes).
    "closure_cells": (("correction", "metadata"), """\
from overlap_course.checks.verdict import passes
for _check in (checks.check_correction, checks.check_metadata_answer):
    _cell = _check.__closure__[_check.__code__.co_freevars.index("check")]
    _cell.cell_contents = lambda *a, **k: passes("ok")
""", True),
    # ... the solution read through readline's history file (C: no audit event) ...
    "readline_solution": (("correction", "metadata"), """\
import json, os, readline
import overlap_course
readline.clear_history()
readline.read_history_file(os.path.join(os.path.dirname(os.path.dirname(overlap_course.__file__)),
                                        "solutions", "04_seqlen_correction.ipynb"))
_text = "\\n".join(readline.get_history_item(i)
                    for i in range(1, readline.get_current_history_length() + 1))
for _cell in json.loads(_text)["cells"]:
    if "BEGIN SOLUTION" in "".join(_cell["source"]):
        exec("".join(_cell["source"]))
""", True),
    # ... and the solution copied to the temporary folder by the kernel, which runs the cells
    # first with no guard, for the judge's run of the same cell to read.
    "smuggled_by_the_kernel": (("correction", "metadata"), f"""\
import json, pathlib
import overlap_course
_drop = pathlib.Path({str(SMUGGLED)!r})
_solution = pathlib.Path(overlap_course.__file__).parents[1] / "solutions" / "{EX04}.ipynb"
try:
    _drop.write_text("\\n".join("".join(c["source"]) for c in json.loads(
        _solution.read_text())["cells"] if "BEGIN SOLUTION" in "".join(c["source"])))
except OSError:
    pass
if _drop.exists():
    exec(_drop.read_text())
""", True),
}
# The module that cheat leaves above the course: the real hmac everywhere, except in a judge
# process, where it reads the judge's request and secret and signs a passing report.
SHADOW_HMAC = """\
import importlib.util, os, sys, sysconfig
_spec = importlib.util.spec_from_file_location(
    "hmac", os.path.join(sysconfig.get_paths()["stdlib"], "hmac.py"))
_real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
if sys.flags.isolated and sys.argv[-1:] in (["answers"], ["check"]):
    import hashlib, json
    sent = json.loads(sys.stdin.buffer.read())
    right = ["set", [["str", n] for n in ("input_ids", "positions", "seqlens_k", "slot_mapping")]]
    report = {"values": [right]} if sys.argv[-1] == "answers" else {"passed": True, "message": "ok"}
    body = json.dumps(report)
    with open(sent["report"], "w") as f:
        f.write(_real.new(sent["secret"].encode(), body.encode(), hashlib.sha256).hexdigest())
        f.write("\\n" + body)
    os._exit(0)
"""
PATCHING_CORRECTION = """\
def correct_seqlens_qk(meta, accepted, block_size):
    import overlap_course.checks.correction_slips as S
    import overlap_course.checks.lesson04 as L
    from overlap_course.checks.verdict import passes
    L.fails = S.fails = lambda *a, **k: passes("ok")  # the checker's next verdict on it passes
"""
# A right answer judged beside a checker the submission's cells changed is not trusted either.
TAMPERS_WITH_THE_CODE_JUDGE = {"patched_builtins"}
# Where Landlock fences the grading kernel (overlap_course/build/kernel_fence.py), these cannot
# read the solution even there: the learner's own kernel is not fooled either.
READ_THE_SOLUTION = {"files_and_solution", "readline_solution", "smuggled_by_the_kernel"}
# Its patched ``set`` reaches torch's meta kernels, written in Python, which exercise 04's check
# runs the correction through: in its own kernel the right correction fails, the wrong metadata
# answer passes (it fools the kernel where it aimed).
FOOLS_ONLY_THE_METADATA = {"patched_builtins"}
CONTROL = ('print("KERNEL PASSES", bool(checks.check_correction(correct_seqlens_qk)), '
           'bool(checks.check_metadata_answer(needs_correction)))\n')


def _cheater(released, wrong: tuple[str, ...], cheat: str | None, patching: bool):
    nb = _submission(released, ROOT / "solutions" / f"{EX04}.ipynb", None)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id == "answer_correct_seqlens_qk" and (patching or "correction" in wrong):
            cell.source = PATCHING_CORRECTION if patching else WRONG_CORRECTION
        if grade_id == "answer_needs_correction" and "metadata" in wrong:
            cell.source = WRONG_METADATA
    graded = [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade")]
    for index in reversed(graded if cheat else []):  # again after the answers below the first
        nb.cells.insert(index, nbformat.v4.new_code_cell(
            f"SHADOW_HMAC = {SHADOW_HMAC!r}\n{cheat}" if "SHADOW_HMAC" in cheat else cheat))
    nb.cells.append(nbformat.v4.new_code_cell(CONTROL))
    return nb


def _alone_unless_fenced(test):
    """Without Landlock a cheat writes hmac.py beside the course, which a process another test
    starts there could import: then no test runs beside this one.  Fenced, the grading kernel
    cannot write it, and the test runs with the others (about 120 s off the part run alone)."""
    return test if landlock.abi() else pytest.mark.alone(test)


@_alone_unless_fenced
@pytest.mark.timeout(1500)
def test_a_submission_cannot_grade_itself(tmp_path):
    """Real nbgrader autograde of exercise 04: each cheat fools the learner's own kernel (its
    control cell says the wrong answers pass) and still scores 0 on every wrong answer."""
    pytest.importorskip("nbgrader", reason="nbgrader is in the dev extra: pip install -e '.[dev]'")
    from nbgrader.api import Gradebook

    home = grading.course(tmp_path / "course", assignments=[EX04])
    _nbgrader(home, "generate_assignment", EX04, "--force")
    released = nbformat.read(home / "release" / EX04 / f"{EX04}.ipynb", as_version=4)
    homes = [home, tmp_path / "course_b"]  # the students in two halves, graded side by side
    shutil.copytree(home, homes[1])
    students = {"right": ((), None, False), **CHEATS}
    home_of = {student: homes[i % 2] for i, student in enumerate(students)}
    for student, (wrong, cheat, _) in students.items():
        folder = home_of[student] / "submitted" / student / EX04
        folder.mkdir(parents=True)
        patching = student == "function_patches_when_called"
        nbformat.write(_cheater(released, wrong, cheat, patching), folder / f"{EX04}.ipynb")
        (folder / "notes.txt").write_text("a file next to the notebook\n")
    try:
        _autograde_side_by_side([(h, EX04) for h in homes])
    finally:
        SMUGGLED.unlink(missing_ok=True)
        shadow = ROOT / "hmac.py"  # a fenced grading kernel cannot write it at all
        assert shadow.exists() or landlock.abi(), "the shadow_module cheat wrote no module"
        shadow.unlink(missing_ok=True)
    for student, (wrong, _, fooled) in students.items():
        home = home_of[student]
        with Gradebook(f"sqlite:///{home / 'gradebook.db'}") as gb:
            patching = student == "function_patches_when_called"
            scores = {cell: gb.find_grade(cell, EX04, EX04, student).score
                      for cell in ("check_correction", "check_metadata_answer")}
            untrusted = patching or student in TAMPERS_WITH_THE_CODE_JUDGE
            want = {"check_correction": 0 if "correction" in wrong or untrusted else 4,
                    "check_metadata_answer": 0 if "metadata" in wrong else 2}
            assert scores == want, (student, scores)
            graded = nbformat.read(home / "autograded" / student / EX04 / f"{EX04}.ipynb",
                                   as_version=4)
            judged = [o for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade")
                      for o in c.outputs]
            assert len(judged) == 2 and all(  # the judge's outputs, not the kernel's
                "judged in a fresh process" in o.get("text", "")
                or o.get("ename") == "CheckNotPassed" for o in judged), (student, judged)
            control = "".join(o.get("text", "") for o in graded.cells[-1].outputs)
            fooled = fooled and not (landlock.abi() and student in READ_THE_SOLUTION)
            said = "False True" if student in FOOLS_ONLY_THE_METADATA else "True True"
            assert (f"KERNEL PASSES {said}" in control) == (fooled or student == "right"), (
                student, control, graded.cells[-1].outputs)
