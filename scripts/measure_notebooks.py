"""Measure what the course costs a learner: run time and memory of each notebook.

    python scripts/measure_notebooks.py                      # all notebooks and exercises
    python scripts/measure_notebooks.py notebooks/02_serial_engine.ipynb --json out.json
    python scripts/measure_notebooks.py --record       # measure all, store docs/learner_times.json, --update
    python scripts/measure_notebooks.py --record notebooks/06_real_traces.ipynb   # re-measure only these
    python scripts/measure_notebooks.py --update       # rewrite the time lines and tables from that file

Each notebook is copied to a temporary folder and executed the way the course does it,
``python -m overlap_course.build.notebooks execute COPY`` (the repository is not touched).  Reported per
notebook: cells, markdown words and reading minutes at 200 words a minute; wall seconds
(kernel start included) and CPU seconds of the whole process tree; the load average when it
started (timings taken on a busy machine are upper bounds: say so); and, sampled every 0.1 s,
the peak memory of the learner's processes -- kernel, device processes (forked by
multiprocessing's forkserver) and multiprocessing helpers -- as USS (memory unique to them,
freed when they exit) and PSS (plus their share of pages shared with other processes).
The numbers in the notebook headers, the README and docs/instructor_guide.md come from it:
``--record`` stores the measurements in ``docs/learner_times.json`` and ``--update`` writes the
**Time:** line of every header, the README's time column and the instructor guide's table from
that file and the notebooks as they are now (cells, words, checked cells), so the tables cannot
drift from the course: ``tests/test_course_shape.py`` fails when they would change.
"""

from __future__ import annotations

import _signal  # loaded at Python's start: no import before SIGINT is held

# POSIX: a Ctrl-C while the course package imports waits for interruptible's handler
_held = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(
    _signal, "pthread_sigmask") else None
from overlap_course.ctrl_c import interruptible  # noqa: E402

interruptible(__name__, "measure_notebooks", _held)  # first: a Ctrl-C from here is one line

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import nbformat  # noqa: E402
import psutil  # noqa: E402

from overlap_course.build.setup_cell import CELL_ID as SETUP_CELL_ID, read_notebook  # noqa: E402
from overlap_course.command_line import (Parser, fail, locked, not_an_input,  # noqa: E402
                                         out_file, run)
from overlap_course.safe_json import (dumps, name_text, quoted, signals_held,  # noqa: E402
                                      write_file)

REPO = Path(__file__).resolve().parent.parent
WORDS_PER_MINUTE = 200
TIMES = REPO / "docs" / "learner_times.json"
README = REPO / "README.md"
GUIDE = REPO / "docs" / "instructor_guide.md"
# The order a learner takes the course in, with our estimate of the minutes it takes to write an
# exercise's code (an estimate, not a measurement: the tables say so).
COURSE = {
    "notebooks/00_start_here": 0,
    "notebooks/01_tiny_gpt": 0,
    "notebooks/02_serial_engine": 0,
    "exercises/02_serial_loop": 10,
    "notebooks/03a_zos_order": 0,
    "exercises/03_zos_loop": 20,
    "notebooks/03b_zos_measured": 0,
    "notebooks/04_stale_lengths": 0,
    "exercises/04_seqlen_correction": 15,
    "notebooks/05_ownership": 0,
    "exercises/05_lifetime": 10,
    "notebooks/06_real_traces": 0,
    "notebooks/07_bugs_that_shipped": 0,
    "notebooks/07b_bugs_of_2026": 0,
}
#: Listed in the tables and tracks, but not part of "the whole course" total: an optional chapter.
OPTIONAL = {"notebooks/06_real_traces", "notebooks/07_bugs_that_shipped",
            "notebooks/07b_bugs_of_2026"}
#: Run time measured, learner minutes not: no learner has tried them yet, and a formula would have
#: to guess the minutes of writing their fixes.  Shown as "not yet measured", left out of the totals.
UNTIMED = {"notebooks/07_bugs_that_shipped", "notebooks/07b_bugs_of_2026"}
MINUTES_PER_CHECK = 2  # answering one checked cell: our estimate
CHECK_CALL = re.compile(r"\bchecks\.check_\w+\(")
ANSWER_STUB = re.compile(r"^\w+\s*=\s*None\s*#\s*your answer", re.M)
CHECKED_ARG = re.compile(r"^(?:\w+\s*=\s*)?checks\.check_\w+\((\w+)", re.M)
TIME_LINE = re.compile(r"^(\s*(?:\* )?)\*\*Time:\*\*.*$", re.M)


def prose_words(nb) -> int:
    """Words of the markdown cells, without the header's ``**Time:**`` line (this script's
    own output, about 40 words: counting it would move the count each time it is rewritten)."""
    return sum(len(TIME_LINE.sub("", c.source).split()) for c in nb.cells if c.cell_type == "markdown")


def _role(proc: psutil.Process) -> str | None:
    cmd = " ".join(proc.cmdline())
    if "ipykernel" in cmd:
        return "kernel"
    if "forkserver" in cmd and "forkserver" in " ".join(psutil.Process(proc.ppid()).cmdline()):
        return "device"
    if "multiprocessing" in cmd:
        return "helper"
    return None


def shown(path: Path) -> str:
    """``path`` as the table names it: from the repository, or whole if it is outside."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def measure(path: Path, workdir: Path) -> dict:
    nb = read_notebook(path)
    words = prose_words(nb)
    copy = workdir / path.name
    nbformat.write(nb, copy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    # Its own session: a Ctrl-C reaches it once, from here (_stop), not twice (the terminal's too).
    proc = subprocess.Popen([sys.executable, "-m", "overlap_course.build.notebooks", "execute",
                             str(copy)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    peak = {"uss_mb": 0.0, "pss_mb": 0.0, "kernel_uss_mb": 0.0, "device_processes": 0}
    done = threading.Event()

    def sample():
        root = psutil.Process(proc.pid)
        while not done.is_set():
            uss = pss = kernel = 0
            devices = 0
            try:
                children = root.children(recursive=True)
            except psutil.Error:
                return
            for child in children:
                try:
                    role, mem = _role(child), child.memory_full_info()
                except psutil.Error:
                    continue
                if role is None:
                    continue
                uss, pss = uss + mem.uss, pss + mem.pss
                kernel += mem.uss if role == "kernel" else 0
                devices += role == "device"
            for key, value in (("uss_mb", uss / 2**20), ("pss_mb", pss / 2**20), ("kernel_uss_mb", kernel / 2**20),
                               ("device_processes", devices)):
                peak[key] = max(peak[key], value)
            done.wait(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    status = None
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        done.set()
        if status is None:  # Ctrl-C (or a kill): the notebook is stopped too, not left running
            _stop(proc)
        sampler.join()
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        said = proc.stderr.read().decode(errors="replace").strip().splitlines() or ["nothing"]
        # it names the copy, whose folder is gone when this is read: the learner's notebook
        said = said[-1].replace(quoted(str(copy), 200), quoted(str(path), 200))
        raise RuntimeError(f"{shown(path)} failed to execute (exit "
                           f"{os.waitstatus_to_exitcode(status)}): {said}")
    return {"notebook": shown(path), "cells": len(nb.cells), "words": words,
            "reading_min": round(words / WORDS_PER_MINUTE, 1), "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "load_average": round(load, 1),
            **{k: round(v) for k, v in peak.items()}}


def _stop(proc: subprocess.Popen) -> None:
    """Stop the notebook being measured as Ctrl-C stops it (it shuts its kernel down) and wait
    for it; a second Ctrl-C meanwhile kills it at once."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait()
    except BaseException:
        proc.kill()
        raise


def _answer_names(rel: str) -> set[str]:
    """What the learner writes in an exercise: names defined in its source's solution regions."""
    if not rel.startswith("exercises/"):
        return set()
    nb = nbformat.read(REPO / "source" / f"{Path(rel).name}.ipynb", as_version=4)
    return {name for c in nb.cells if "### BEGIN SOLUTION" in c.source
            for name in re.findall(r"^(?:def (\w+)|(\w+)\s*=)", c.source, re.M) for name in name if name}


def checked_cells(rel: str) -> list[int]:
    """Cells where the learner's own answer is checked at once: in a notebook, a check call on a
    ``name = None  # your answer`` stub; in an exercise, a check call on something the learner writes
    (demonstrations of a checker on the notebook's own code and summary prints do not count)."""
    nb = nbformat.read(REPO / f"{rel}.ipynb", as_version=4)
    answers = _answer_names(rel)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if rel.startswith("notebooks/"):
            if CHECK_CALL.search(cell.source) and ANSWER_STUB.search(cell.source):
                found.append(i)
        elif any(arg in answers for arg in CHECKED_ARG.findall(cell.source)):
            found.append(i)
    return found


def shape(rel: str) -> dict:
    """Cells, markdown words and checked cells (see :func:`checked_cells`).  The course setup cell
    (overlap_course/build/setup_cell.py) is not counted: it is not the lesson, and where the
    course is installed it does nothing."""
    nb = nbformat.read(REPO / f"{rel}.ipynb", as_version=4)
    return {"cells": sum(c.get("id") != SETUP_CELL_ID for c in nb.cells),
            "words": prose_words(nb),
            "checks": len(checked_cells(rel))}


def _measured_as(rel: str) -> str:
    """What is executed to time ``rel``: an exercise's solution (the stub version skips the
    checkers' engines: 8 s and no device process for exercise 04, against its solution's run)."""
    return rel.replace("exercises/", "solutions/", 1)


def learner_minutes(rel: str, sh: dict, run: dict) -> int:
    """Reading at 200 words a minute + estimated answering and coding time + the measured run."""
    return math.ceil(sh["words"] / WORDS_PER_MINUTE + sh["checks"] * MINUTES_PER_CHECK + COURSE[rel]
                     + run["wall_s"] / 60)


def _conditions(run: dict) -> str:
    # the 1-minute load average still holds the previous notebook's run: quiet below one per CPU
    busy = "quiet" if run["load_average"] < run["cpus"] else "busy shared"
    return f"{busy} {run['cpus']:g}-CPU machine, load {run['load_average']:.1f}"


def time_line(rel: str, sh: dict, run: dict) -> str:
    if rel in UNTIMED:
        return (f"**Time:** not yet measured with learners: {sh['words'] / WORDS_PER_MINUTE:.0f} min reading "
                f"({sh['words']:,} words), {sh['checks']} checked cells and the fixes to write; {run['cpu_s']:.0f} s "
                f"CPU / {run['wall_s']:.0f} s wall to run every cell ({_conditions(run)}).")
    code = f", about {COURSE[rel]} min writing code (estimated)" if COURSE[rel] else ""
    return (f"**Time:** about {learner_minutes(rel, sh, run)} min: {sh['words'] / WORDS_PER_MINUTE:.0f} min reading "
            f"({sh['words']:,} words), {sh['checks']} checked cell{'s' * (sh['checks'] != 1)} "
            f"(~{MINUTES_PER_CHECK} min each, estimated){code}, and {run['cpu_s']:.0f} s CPU / "
            f"{run['wall_s']:.0f} s wall to run every cell ({_conditions(run)}).")


def _separately(times: dict) -> list[str]:
    """Notebooks re-measured on their own (``--record PATH``), with when and where."""
    return [f"`{rel}` on {run['date']} at commit {run['commit']}" for rel, run in times["runs"].items()
            if rel in COURSE and run.get("date") and (run["date"], run.get("commit")) != (times["date"], times["commit"])]


def guide_table(times: dict, shapes: dict, minutes: dict) -> str:
    alone = _separately(times)
    rows = [f"Measured {times['date']} at commit {times['commit']} with `python scripts/measure_notebooks.py "
            f"--record` (load average in brackets)" + (f"; measured on its own with `--record PATH`: "
                                                       f"{', '.join(alone)}" if alone else "") + ".", "",
            "| notebook | cells | words | reading | checked cells | run: CPU / wall (load) | peak memory, unique "
            "(device processes) | self-paced total |", "|---|---|---|---|---|---|---|---|"]
    for rel, code_min in COURSE.items():
        sh, run = shapes[rel], times["runs"][rel]
        checks = f"{sh['checks']}" + (f" (code: ~{code_min} min)" if code_min else "")
        name = f"`{rel}` (optional)" if rel in OPTIONAL else f"`{rel}`"
        rows.append(f"| {name} | {sh['cells']} | {sh['words']:,} | {sh['words'] / WORDS_PER_MINUTE:.0f} min | {checks} "
                    f"| {run['cpu_s']:.0f} s / {run['wall_s']:.0f} s ({run['load_average']:.1f}) | "
                    f"{run['uss_mb']} MB ({run['device_processes']}) | "
                    f"{'not yet measured' if rel in UNTIMED else f'{minutes[rel]} min'} |")
    minutes = {rel: m for rel, m in minutes.items() if rel not in UNTIMED}
    total = sum(m for rel, m in minutes.items() if rel not in OPTIONAL)
    rows.append(f"| **all**{' (optional notebooks aside)' if OPTIONAL else ''} | | | | | | | "
                f"**{total / 60:.1f} h** ({total} min) |")
    if OPTIONAL:
        untimed = ", ".join(Path(rel).name.split("_")[0] for rel in COURSE if rel in UNTIMED)
        rows.append(f"| **with the optional notebooks**{f' ({untimed}: not yet measured)' if untimed else ''} "
                    f"| | | | | | | **{sum(minutes.values()) / 60:.1f} h** ({sum(minutes.values())} min) |")
    return "\n".join(rows)


def _replace(text: str, pattern: str, new: str, where: str) -> str:
    found = re.search(pattern, text, flags=re.S | re.M)
    if not found:
        raise ValueError(f"{where}: no text matching {pattern!r} to replace")
    return text[:found.start()] + new + text[found.end():]


def _copies(rel: str) -> list[Path]:
    """The notebooks with ``rel``'s header: an exercise's lives in source/ and in both generated
    copies (kept identical); :func:`shape` reads the first, :func:`_answer_names` source/'s."""
    copies = [REPO / f"{rel}.ipynb"]
    if rel.startswith("exercises/"):
        name = Path(rel).name + ".ipynb"
        copies += [REPO / "source" / name, REPO / "solutions" / name]
    return copies


def update_files() -> dict[Path, str]:
    """Every file :func:`updated_files` reads or rewrites (path -> what, for a message), and the
    measurements it is given: what ``--record``'s ``--json`` must not overwrite."""
    files = {path: f"the notebook {shown(path)}" for rel in COURSE for path in _copies(rel)}
    return {**files, README: "the README", GUIDE: f"the guide ({shown(GUIDE)})",
            TIMES: f"the stored measurements ({shown(TIMES)})"}


def updated_files(times: dict) -> dict[Path, str]:
    """Every file whose time line or table differs from what ``times`` and the notebooks give now."""
    shapes = {rel: shape(rel) for rel in COURSE}  # each notebook read once
    missing = [rel for rel in COURSE if rel not in times["runs"]]
    stale = [f"{rel} ({times['runs'][rel]['cells']} cells measured, {shapes[rel]['cells']} now)" for rel in COURSE
             if rel not in missing and times["runs"][rel]["cells"] != shapes[rel]["cells"]]
    if missing or stale:
        raise ValueError(f"{TIMES.relative_to(REPO)} does not measure {missing} and is older than {stale}: "
                         f"run `python scripts/measure_notebooks.py --record` on a quiet machine")
    changed: dict[Path, str] = {}
    minutes = {rel: learner_minutes(rel, shapes[rel], times["runs"][rel]) for rel in COURSE}
    timed = [rel for rel in COURSE if rel in OPTIONAL and rel not in UNTIMED]
    total = sum(m for rel, m in minutes.items() if rel not in OPTIONAL)
    optional = ", ".join(Path(rel).name.split("_")[0] for rel in timed)
    with_optional = (f" ({(total + sum(minutes[rel] for rel in timed)) / 60:.1f} with the optional "
                     f"notebook{'s' * (len(timed) > 1)} {optional})" if timed else "")
    for rel in COURSE:
        line = time_line(rel, shapes[rel], times["runs"][rel])
        for path in _copies(rel):
            nb = nbformat.read(path, as_version=4)
            head = nb.cells[0].source
            if not TIME_LINE.search(head):
                raise ValueError(f"{path.relative_to(REPO)}: its first cell needs a `**Time:**` line to fill in")
            new = TIME_LINE.sub(lambda m: m.group(1) + line, head, count=1)
            if new != head:
                nb.cells[0].source = new
                changed[path] = nbformat.writes(nb) + "\n"
    text = README.read_text()
    for rel in COURSE:
        if rel.startswith("notebooks/"):
            sh, run = shapes[rel], times["runs"][rel]
            cell = (f" {'not yet measured' if rel in UNTIMED else f'{minutes[rel]} min'}: "
                    f"{sh['words'] / WORDS_PER_MINUTE:.0f} min reading, "
                    f"{run['cpu_s']:.0f} s CPU / {run['wall_s']:.0f} s wall (load {run['load_average']:.1f}) ")
            row = re.search(rf"^\| `{re.escape(rel)}` \|.*$", text, flags=re.M)
            if not row:
                raise ValueError(f"README.md: no course-table row for `{rel}`")
            cols = row.group(0).split("|")
            cols[4] = cell
            text = text[:row.start()] + "|".join(cols) + text[row.end():]
    exercises = ", ".join(f"{Path(rel).name[:2]} about {minutes[rel]} min" for rel in COURSE
                          if rel.startswith("exercises/"))
    text = _replace(text, r"^Exercises: 02 about .*?hours(?: \([^)]*optional[^)]*\))?\.",
                    f"Exercises: {exercises} (reading, run and an estimated 10–20 minutes of writing code). "
                    f"Self-paced, the whole course is about {total / 60:.1f} hours{with_optional}.", "README.md")
    if text != README.read_text():
        changed[README] = text
    text = _replace(GUIDE.read_text(),
                    r"(?<=<!-- learner-times:begin -->\n).*?(?=\n<!-- learner-times:end -->)",
                    guide_table(times, shapes, minutes), GUIDE.name)
    text = _replace(text, r"the whole course takes about \*\*[^*]+\*\*( \([^)]*optional[^)]*\))?",
                    f"the whole course takes about **{total / 60:.1f} hours**{with_optional}",
                    GUIDE.name)
    if text != GUIDE.read_text():
        changed[GUIDE] = text
    return changed


def _git_commit() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "unknown"


def _notebook(text: str) -> Path:
    """An argparse ``type``: a notebook read before any is measured (measuring takes minutes)."""
    try:
        read_notebook(Path(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return Path(text).resolve()


def _read(paths: list[Path], record: bool) -> dict:
    """What --json must not overwrite: the notebooks measured, and with --record every file its
    update reads or rewrites (:func:`update_files`): --json is written first."""
    return {**(update_files() if record else {}),
            **{path: f"the notebook {shown(path)}" for path in paths}}


def main(argv=None) -> int:
    p = Parser(prog="measure_notebooks", description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", type=_notebook,
                   help="default: notebooks/*.ipynb and exercises/*.ipynb")
    p.add_argument("--json", help="also write the results here (its folder is locked while "
                                  "this runs; not with --update alone, which measures nothing)")
    p.add_argument("--record", action="store_true",
                   help=f"measure the whole course (or only the notebooks given), store it in "
                        f"{TIMES.relative_to(REPO)}, then --update")
    p.add_argument("--update", action="store_true",
                   help=f"only rewrite the headers' time lines and the tables from {TIMES.relative_to(REPO)}")
    a = p.parse_args(argv)
    try:
        if a.json is not None:  # '' too: it was taken as no --json, and nothing written
            a.json = out_file(a.json, "--json", "times.json")
    except ValueError as exc:  # a folder, under a file: before a notebook is measured
        return fail("measure_notebooks", exc)
    if a.update and not a.record:
        if a.json or a.notebooks:  # else taken, and nothing done with them: exit 0, no word
            p.error("--update measures nothing (it rewrites the tables from "
                    f"{TIMES.relative_to(REPO)}): it takes no --json and no notebooks; "
                    "--record PATH... measures them, then updates")
        _write_all(updated_files(json.loads(TIMES.read_text())))
        return 0
    only = []  # --record PATH...: re-measure these, keep the file's other measurements
    if a.record and a.notebooks:
        outside = [str(n) for n in a.notebooks if not n.is_relative_to(REPO)]
        if outside:
            p.error(f"--record measures the course's notebooks; not in {REPO}: {outside}")
        only = [str(n.relative_to(REPO).with_suffix("")).replace("solutions/", "exercises/", 1)
                for n in a.notebooks]
        unknown = [rel for rel in only if rel not in COURSE]
        if unknown:
            p.error(f"not in the course (COURSE): {unknown}")
    if a.record:  # an exercise runs as its solution: answered, its checkers start their engines
        paths = [REPO / f"{_measured_as(rel)}.ipynb" for rel in (only or COURSE)]
    else:
        paths = a.notebooks or sorted((REPO / "notebooks").glob("*.ipynb")) + \
            sorted((REPO / "exercises").glob("*.ipynb"))
    try:  # before a notebook is measured
        if a.json:
            not_an_input(str(a.json), "--json", _read(paths, a.record))
        with _json_folder(a.json) as folder:
            results = _measure_all(paths)
            if a.json:
                folder.still_held("--json's folder")
                named = [{**r, "notebook": name_text(r["notebook"])} for r in results]
                write_file(a.json, dumps(named, "the results", indent=1), "--json")
    except ValueError as exc:
        return fail("measure_notebooks", exc)
    except RuntimeError as exc:  # a notebook raised: its last line says why
        fail("measure_notebooks", exc)
        return 1
    if a.record and only:
        stored = json.loads(TIMES.read_text())
        for rel, r in zip(only, results):
            stored["runs"][rel] = {**r, "date": time.strftime("%Y-%m-%d"), "commit": _git_commit()}
        stored["runs"] = {rel: stored["runs"][rel] for rel in COURSE if rel in stored["runs"]}
    elif a.record:
        stored = {"commit": _git_commit(), "date": time.strftime("%Y-%m-%d"),
                  "runs": {rel: r for rel, r in zip(COURSE, results)}}
    if a.record:
        text = json.dumps(stored, indent=1) + "\n"
        _write_all({TIMES: text, **updated_files(json.loads(text))})
    return 0


def _json_folder(out: Path | None):
    """--json's folder, made if missing and locked (``locked``, as trace export's and
    record_traces' folders), refused before a notebook is measured if it cannot be made or
    written, or if another command holds it: a run whose folder another removed when it was
    interrupted (made for nothing) measured, then failed to write."""
    if out is None:
        return contextlib.nullcontext()
    return locked(out.parent, f"--json {quoted(str(out), 200)}: its folder is being written by "
                              f"another command running now (a measure_notebooks --json, a "
                              f"trace export, a recording): wait for it to end, or name a file "
                              f"in another folder; nothing was measured", shown=out)


def _measure_all(paths: list[Path]) -> list[dict]:
    """Each notebook measured, its row printed as it is; a ``RuntimeError`` if one raised."""
    from overlap_course.measure.machine import usable_cpus
    results = []
    print("| notebook | cells | words | reading | run: CPU / wall (load) | "
          "peak memory: USS / PSS (device processes) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            r = measure(path, Path(tmp))
            r["cpus"] = usable_cpus()
            results.append(r)
            print(f"| `{r['notebook']}` | {r['cells']} | {r['words']:,} | "
                  f"{r['reading_min']:.0f} min | "
                  f"{r['cpu_s']:.0f} s / {r['wall_s']:.0f} s ({r['load_average']:.1f}) | "
                  f"{r['uss_mb']} / {r['pss_mb']} MB ({r['device_processes']}) |", flush=True)
    return results


def _write_all(files: dict[Path, str]) -> None:
    """Each file whole, and a Ctrl-C waits until all are written: the headers, the README and
    the guide must agree with docs/learner_times.json (tests/test_course_shape.py)."""
    with signals_held():
        for path, text in files.items():
            write_file(path, text, str(path.relative_to(REPO)))
    for path in files:
        if path != TIMES:
            print(f"updated {path.relative_to(REPO)}")


if __name__ == "__main__":
    run("measure_notebooks", main)  # Ctrl-C: one line, 130 (a second one ends it at once)
