"""docs/real_engines.md, the map from the toy to real engines, keeps the promises it makes.

A reader follows its references into four large code bases, so the checks are on what makes a
reference followable: every row of every stage table names where the thing happens, the toy's
paths exist here and define the name cited, every code reference names a file and commit listed
under "Sources read", every PR or issue comes with a date, and the support table is dated.
Whether the facts are right is not checkable offline; the shape is, and a broken shape is how a
map rots (a renamed toy function, a reference without a commit, a row left empty).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "real_engines.md"
ENGINES = {"SGLang": "sgl-project/sglang", "vLLM": "vllm-project/vllm",
           "TensorRT-LLM": "NVIDIA/TensorRT-LLM", "mini-sglang": "sgl-project/mini-sglang"}
ROWS = ("toy", *ENGINES)
STAGES = ("The loop", "Schedule", "Prepare inputs", "Future-token map", "Launch forward",
          "Process previous results", "Launch sample", "The flush at the end", "Prefill results",
          "The extra step after a finish", "Freeing a finished request while a round is in flight",
          "Seqlen correction under speculation")
STAGE_HEADER = ["engine", "where", "what happens there"]
SUPPORT = "What each engine runs together with overlap"
SUPPORT_HEADER = ["engine", "overlap on by default", "with speculative decoding",
                  "with structured output (grammar)", "with pipeline parallelism"]
SOURCES = "Sources read"
# Tables whose rows are PRs and issues, each cited with its state and date (issue 36's update)
TRACKER_TABLES = {
    "Other engines that overlap": ["engine", "what it overlaps", "reference"],
    "Overlap bugs of 2025–2026": ["engine", "reference", "what went wrong", "in the toy"]}
STATE = re.compile(r"^`?\s*\((merged|closed|open)\b")

CODE_REF = re.compile(r"`(?P<repo>[\w.-]+/[\w.-]+)@(?P<sha>[0-9a-f]{8}) (?P<path>[\w./-]+): (?P<name>[^`]+)`")
TRACKER_REF = re.compile(r"`(?P<repo>[\w.-]+/[\w.-]+)#(?P<number>\d+)`")
TOY_REF = re.compile(r"`(?P<path>toy_engine/[\w/]+\.py): (?P<name>[\w.]+)`")
DATED_LINK = re.compile(r"\]\(https?://[^)]+\)[^|]*\b20\d\d-\d\d-\d\d\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def sections(text: str) -> dict[str, str]:
    """The page's ``## `` sections by title."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def table(body: str) -> list[list[str]]:
    """The first markdown table of a section: header and rows as lists of cells."""
    lines = [ln for ln in body.splitlines() if ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    return [r for r in rows if not all(set(c) <= set("-: ") for c in r)]


def sources(text: str) -> set[tuple[str, str, str]]:
    """(repository, file, full commit) of every file the page says it read."""
    return {tuple(r) for r in table(sections(text).get(SOURCES, ""))[1:]}


def toy_name_defined(path: str, name: str) -> bool:
    """Whether ``name`` (``f``, ``CONST`` or ``Class.method``) is defined in the toy's file."""
    file = REPO / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    scope, *rest = name.split(".")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == scope:
            if not rest:
                return True
            return isinstance(node, ast.ClassDef) and any(
                isinstance(n, ast.FunctionDef) and n.name == rest[0] for n in node.body)
        if not rest and isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == scope for t in node.targets):
            return True
    return False


def reference_problems(text: str) -> list[str]:
    """Code references not listed under Sources read; toy references that do not resolve."""
    read = sources(text)
    problems = [f"Sources read: {repo} {path}: commit {sha!r} is not 40 hex digits"
                for repo, path, sha in read if not re.fullmatch(r"[0-9a-f]{40}", sha)]
    for m in CODE_REF.finditer(text):
        if not any(r == m["repo"] and p == m["path"] and s.startswith(m["sha"]) for r, p, s in read):
            problems.append(f"{m.group(0)}: that file at that commit is not under Sources read")
    for m in TOY_REF.finditer(text):
        if not toy_name_defined(m["path"], m["name"]):
            what = "no such file" if not (REPO / m["path"]).is_file() else f"defines no `{m['name']}`"
            problems.append(f"{m.group(0)}: {what} in this repository")
    return problems


def undated_trackers(row: str) -> list[str]:
    """PRs and issues in a row with no date (or "not found") before the next one."""
    refs = list(TRACKER_REF.finditer(row))
    ends = [m.start() for m in refs[1:]] + [len(row)]
    return [m.group(0) for m, end in zip(refs, ends)
            if not (DATE.search(row, m.end(), end) or "not found" in row[m.end():end])]


def stage_problems(text: str) -> list[str]:
    """Each stage has a table with a row per engine, and each row says where, with a reference."""
    found, problems = sections(text), []
    for stage in STAGES:
        if stage not in found:
            problems.append(f"no section `## {stage}`")
            continue
        rows = table(found[stage])
        if not rows or rows[0] != STAGE_HEADER:
            problems.append(f"{stage}: the table's header is not {STAGE_HEADER}")
            continue
        names = [r[0] for r in rows[1:]]
        if names != list(ROWS):
            problems.append(f"{stage}: rows {names}, expected {list(ROWS)}")
            continue
        for name, where, what in (r[:3] for r in rows[1:]):
            if not what:
                problems.append(f"{stage} / {name}: says nothing about what happens there")
            if name == "toy":
                if not TOY_REF.search(where):
                    problems.append(f"{stage} / toy: no `toy_engine/FILE.py: name` reference")
                continue
            repo = ENGINES[name]
            refs = [m["repo"] for m in (*CODE_REF.finditer(where), *TRACKER_REF.finditer(where))]
            if repo not in refs:
                problems.append(f"{stage} / {name}: `where` has no reference into {repo}")
            problems += [f"{stage} / {name}: {ref} without its date" for ref in undated_trackers(f"{where} | {what}")]
    return problems


def support_problems(text: str) -> list[str]:
    """Every cell of the support table is referenced into its engine's repository and dated."""
    rows = table(sections(text).get(SUPPORT, ""))
    if not rows or rows[0] != SUPPORT_HEADER:
        return [f"{SUPPORT}: no table with the header {SUPPORT_HEADER}"]
    if [r[0] for r in rows[1:]] != list(ENGINES):
        return [f"{SUPPORT}: rows {[r[0] for r in rows[1:]]}, expected {list(ENGINES)}"]
    problems = []
    for name, *cells in rows[1:]:
        for feature, cell in zip(SUPPORT_HEADER[1:], cells):
            refs = [m["repo"] for m in (*CODE_REF.finditer(cell), *TRACKER_REF.finditer(cell))]
            problems += [f"{SUPPORT} / {name} / {feature}: {ref} without its date" for ref in undated_trackers(cell)]
            if ENGINES[name] not in refs:
                problems.append(f"{SUPPORT} / {name} / {feature}: no reference into {ENGINES[name]}")
            if not cell.startswith("not found") and not (DATE.search(cell) or DATED_LINK.search(cell)):
                problems.append(f"{SUPPORT} / {name} / {feature}: not dated")
    return problems


def tracker_table_problems(text: str) -> list[str]:
    """Each row of the tracker tables cites a PR or issue, every one with its state and date."""
    found, problems = sections(text), []
    for title, header in TRACKER_TABLES.items():
        rows = table(found.get(title, ""))
        if not rows or rows[0] != header:
            problems.append(f"{title}: no table with the header {header}")
            continue
        if len(rows) < 3:
            problems.append(f"{title}: fewer than two rows")
        for row in rows[1:]:
            cells = " | ".join(row)
            refs = list(TRACKER_REF.finditer(cells))
            if not refs:
                problems.append(f"{title} / {row[0]}: cites no PR or issue")
            problems += [f"{title} / {row[0]}: {ref} without its date"
                         for ref in undated_trackers(cells)]
            stateless = [m.group(0) for m in refs if not STATE.match(cells[m.end():])]
            problems += [f"{title} / {row[0]}: {ref} without its state (merged, closed, open)"
                         for ref in stateless]
    return problems


def test_every_stage_says_where_in_each_engine_with_a_reference():
    assert stage_problems(DOC.read_text()) == []


def test_the_support_table_is_dated_and_referenced():
    assert support_problems(DOC.read_text()) == []


def test_the_tables_of_other_engines_and_bugs_cite_dated_prs_with_their_state():
    assert tracker_table_problems(DOC.read_text()) == []


def test_every_reference_names_a_file_read_at_a_commit_or_a_toy_name_that_exists():
    assert reference_problems(DOC.read_text()) == []


MUTATIONS = {
    "a row loses its reference": (
        "`vllm-project/vllm@00024d31 vllm/v1/core/sched/scheduler.py: Scheduler.schedule` |", "vLLM's scheduler |",
        stage_problems),
    "a stage disappears": ("## Launch sample", "## Sampling", stage_problems),
    "an engine row goes missing": ("| mini-sglang | `sgl-project/mini-sglang#134` |", "| | |", stage_problems),
    "a PR loses its date": ("`vllm-project/vllm#27922`, merged, opened 2025-11-01", "`vllm-project/vllm#27922`, merged",
                            stage_problems),
    "a commit that was not read": ("vllm-project/vllm@00024d31", "vllm-project/vllm@deadbeef", reference_problems),
    "a toy function renamed": ("`toy_engine/stages.py: RoundStages.launch_sample`",
                               "`toy_engine/engine.py: Engine.launch_sampling`", reference_problems),
    "a support cell loses its date": ("(merged, opened 2024-11-19)", "(merged)", support_problems),
    "a bug loses its state": ("`NVIDIA/TensorRT-LLM#16280` (closed, opened 2026-07-12)",
                              "`NVIDIA/TensorRT-LLM#16280` (opened 2026-07-12)",
                              tracker_table_problems),
    "a bug loses its date": ("`sgl-project/sglang#24745` (closed, opened 2026-05-09) |",
                             "`sgl-project/sglang#24745` (closed) |", tracker_table_problems),
    "a table of bugs disappears": ("## Overlap bugs of 2025–2026", "## Bugs",
                                   tracker_table_problems),
}


@pytest.mark.parametrize("change", MUTATIONS)
def test_the_checks_catch_a_broken_map(change):
    old, new, check = MUTATIONS[change]
    text = DOC.read_text()
    assert text.count(old) >= 1, f"the page no longer contains {old!r}: update this mutation"
    assert check(text.replace(old, new)), f"{check.__name__} did not notice: {change}"


def test_the_map_is_on_the_site_and_linked_from_the_readme(tmp_path):
    readme = (REPO / "README.md").read_text()
    course = readme.split("## The course", 1)[1].split("\n## ", 1)[0]
    assert "(docs/real_engines.md)" in course, "README's 'The course' section does not link docs/real_engines.md"
    spec = importlib.util.spec_from_file_location("site_build", REPO / "site" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    src = build.stage(tmp_path)
    assert (src / "real_engines.md").read_text() == DOC.read_text()
    assert re.search(r"^real_engines$", (src / "index.md").read_text(), re.M), "site/index.md's toctree lacks it"
