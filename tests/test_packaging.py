"""Setup files agree with each other, and the course notebooks are generated and stored well."""

import re
import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from overlap_course.build import notebooks as course

ROOT = Path(__file__).resolve().parent.parent


# The oldest torch the code can run on, API by API.  Read off torch's release notes and API
# docs against our code; only the pinned torch (environment.yml, 2.13.0) is installed and run,
# by CI and the developers -- no other torch version was tried.
TORCH_FLOOR = {
    "Tensor.scatter_reduce(dim, index, src, 'amax') in overlap_course/corpus.py": "1.12",
    "torch.load(..., weights_only=True) in model.py": "1.13",
    "a wheel for Python 3.11, the oldest Python declared (pip picks a torch with a wheel for "
    "a newer one: 3.14's since torch 2.9)": "2.0",
    "a build against NumPy 2 (numpy>=2 is a dependency; older builds warn at import and cannot "
    "exchange arrays with it)": "2.3",
}
# Extras that environment.yml (Binder, a learner's conda env) leaves out, and why.
NOT_IN_ENVIRONMENT_YML = {
    "hub": "a hub's user environment; Binder brings the jupyterhub-singleuser that matches its own hub",
}
# Hosts of package registries: no file may name one (pip, npm, apt use their own configuration).
REGISTRY_HOSTS = re.compile(r"pypi\.org|pythonhosted\.org|npmjs\.(?:org|com)|yarnpkg\.com|debian\.org|"
                            r"ubuntu\.com|anaconda\.(?:org|com)|crates\.io|rubygems\.org|proxy\.golang\.org")
# PyTorch's CPU index may be named only where torch is installed (spelt in pieces here, so
# that this file does not name it).
PYTORCH_INDEX_HOST = ".".join(["download", "pytorch", "org"])
TORCH_INSTALLERS = {"environment.yml", "scripts/install_torch.sh"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared(*, with_hub: bool) -> list[Requirement]:
    project = _project()
    reqs = list(project["dependencies"])
    for extra, deps in project["optional-dependencies"].items():
        if with_hub or extra not in NOT_IN_ENVIRONMENT_YML:
            reqs += deps
    return [Requirement(r) for r in reqs]


def _environment_yml() -> tuple[str, dict[str, str]]:
    """environment.yml's python version and its pip entries (name -> version pin)."""
    lines = (ROOT / "environment.yml").read_text().splitlines()
    python = next(line.split("=", 1)[1].strip() for line in lines if line.strip().startswith("- python="))
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    pins = {}
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the end of the pip: list
        item = line.strip()[2:].strip()
        if item and not item.startswith("--"):
            name, sep, version = item.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9A-Za-z.]*", version), (
                f"environment.yml: {item!r} is not an exact pin; write name==version")
            pins[name.lower()] = version
    return python, pins


def test_environment_yml_pins_lie_in_pyproject_ranges():
    _, pins = _environment_yml()
    declared = {r.name.lower(): r for r in _declared(with_hub=False)}
    assert set(pins) == set(declared), (
        f"only in environment.yml: {sorted(set(pins) - set(declared))}; "
        f"only in pyproject.toml: {sorted(set(declared) - set(pins))}")
    for name, req in declared.items():
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"environment.yml pins {name}=={pins[name]}, outside pyproject.toml's {req}")


def test_installed_versions_lie_in_declared_ranges():
    """What this environment runs is what pyproject.toml promises; torch is the pinned one."""
    for req in _declared(with_hub=False):
        installed = Version(version(req.name))
        assert req.specifier.contains(installed, prereleases=True), f"installed {req.name} {installed}, declared {req}"
    torch_pin = _environment_yml()[1]["torch"]
    assert Version(version("torch")).base_version == torch_pin, (
        f"installed torch {version('torch')}; CI must test environment.yml's torch=={torch_pin}")


def test_installed_versions_are_environment_yml_pins():
    """environment.yml (Binder, conda) pins what `./run.sh setup` installs: every package it names
    is installed here at exactly that version (torch's local build label, e.g. "+cpu", aside)."""
    differ = {}
    for name, pin in _environment_yml()[1].items():
        installed = Version(version(name))
        if Version(installed.public) != Version(pin):
            differ[name] = f"environment.yml {pin}, installed {installed}"
    assert not differ, f"environment.yml's pins are not what setup installed: {differ}"


def test_torch_range_is_what_the_code_needs():
    torch_req = next(r for r in _declared(with_hub=False) if r.name == "torch")
    floor = max(TORCH_FLOOR.values(), key=Version)
    assert str(torch_req.specifier) == f"<3,>={floor}", (
        f"pyproject.toml declares {torch_req}; the code needs torch>={floor} (TORCH_FLOOR) and "
        f"a new major version may drop APIs: declare torch>={floor},<3")


# The Pythons CI runs (.ci/run: ./run.sh on the first, a fresh clone on the second) and the
# Pythons declared: requires-python's floor, environment.yml's Python and run.sh's floor are the
# oldest; the classifiers name each minor version from there to the newest torch has wheels for.
CI_PYTHONS = ("3.11", "3.13")
DECLARED_PYTHONS = ("3.11", "3.12", "3.13", "3.14")


def test_python_versions_declared_agree_with_ci_run_sh_and_readme():
    project = _project()
    python, _ = _environment_yml()
    classifiers = sorted(c.rsplit("::", 1)[1].strip() for c in project.get("classifiers", [])
                         if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    allowed = [f"3.{minor}" for minor in range(8, 20)
               if SpecifierSet(project["requires-python"]).contains(f"3.{minor}.0")]
    assert classifiers == list(DECLARED_PYTHONS), f"classifiers say {classifiers}"
    assert allowed[0] == DECLARED_PYTHONS[0] == python and set(DECLARED_PYTHONS) <= set(allowed), (
        f"requires-python {project['requires-python']!r} admits {allowed}; environment.yml says "
        f"{python}; declared: {DECLARED_PYTHONS}")
    run_sh = (ROOT / "run.sh").read_text()
    floor = tuple(int(p) for p in DECLARED_PYTHONS[0].split("."))
    assert f"sys.version_info[:2] < {floor}" in run_sh, f"run.sh does not refuse below {floor}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert CI_PYTHONS[0] == DECLARED_PYTHONS[0] and set(CI_PYTHONS) <= set(DECLARED_PYTHONS)
    assert f".ci/python_leg {CI_PYTHONS[1]}" in ci, f"CI has no leg on Python {CI_PYTHONS[1]}"
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Platforms"):readme.index("## Hosted runtimes")]
    for minor in DECLARED_PYTHONS:
        assert f"| Python {minor} |" in table, f"README's platform table has no row for {minor}"


def test_hub_installer_pins_a_jupyterhub_in_the_hub_extra():
    hub = Requirement(_project()["optional-dependencies"]["hub"][0])
    script = (ROOT / "scripts" / "install_hub.sh").read_text()
    pinned = re.search(r"^JUPYTERHUB_VERSION=([0-9.]+)", script, re.M).group(1)
    assert hub.name == "jupyterhub" and hub.specifier.contains(pinned), f"install_hub.sh pins {pinned}, extra {hub}"


def test_no_file_names_a_package_registry_host():
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True,
                               text=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot list the tracked files")
    bad, index_users = [], set()
    for rel in filter(None, files):
        try:
            text = (ROOT / rel).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary (checkpoint), or deleted in the work tree
        bad += [f"{rel}: {m.group(0)}" for m in REGISTRY_HOSTS.finditer(text)]
        if PYTORCH_INDEX_HOST in text:
            index_users.add(rel)
    assert not bad, f"registry hosts named in tracked files (pip/npm/apt pick the index): {bad}"
    assert index_users <= TORCH_INSTALLERS, f"PyTorch's index named outside torch's installers: {index_users}"


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
