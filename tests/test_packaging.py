"""Setup files agree with each other, and the course notebooks are generated and stored well."""

import re
import tomllib
from pathlib import Path

from toy_engine import course

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].lower()


def test_environment_yml_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    pip = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the end of the pip: list
        item = line.strip()[2:].strip()
        if item and not item.startswith("--"):
            pip.append(item)
    env = {_name(x): x for x in pip}
    for req in wanted:
        name = _name(req)
        if name == "torch":
            assert env["torch"] == "torch==2.13.0", "environment.yml must pin the torch CI tests"
        else:
            assert env.get(name) == req, f"environment.yml has {env.get(name)!r}, pyproject {req!r}"
    assert set(env) == {_name(r) for r in wanted}


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./run.sh test" in readme and "./run.sh lab" in readme
    assert "./run.sh test" in ci


def test_course_notebooks_are_generated_and_stored_well():
    assert course.check() == []


def test_solution_markers_become_stubs_or_answers():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"
    assert course.strip_solution(src, keep=True) == "def f(x):\n    return x + 1"
    exercise = course.strip_solution(src, keep=False)
    assert "return x + 1" not in exercise and "    raise NotImplementedError" in exercise
    top = "### BEGIN SOLUTION: answer = None\nanswer = {1, 2}\n### END SOLUTION"
    assert course.strip_solution(top, keep=False) == "answer = None"
