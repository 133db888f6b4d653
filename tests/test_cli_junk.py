"""Every command line of the course, fed junk: junk arguments and junk files (issue 34).

The property, exactly: a command exits 2 with one line on stderr and nothing on stdout, or exits
0 -- and then, where it claims JSON, stdout is JSON (no NaN, no Infinity); never a traceback,
never another status.  Commands run in-process (``main(argv)`` with captured streams) so that
hypothesis can try many inputs in seconds; the parts that would start an engine or a server are
replaced by stand-ins that say so (:class:`Command`'s ``stand_ins``).  A few junk inputs go
through ``python -m`` as well, to prove the whole path (interpreter, ``__main__``, exit status).

To add a command, append a :class:`Command` to ``COMMANDS``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlap_course import progress
from overlap_course.build import grading
from overlap_course import progress_service as ps
from overlap_course.measure import bench
from overlap_course.traces import kineto
from overlap_course.traces.kineto import cli as kineto_cli
from overlap_course.traces.recorded import TRACES_DIR, load_trace

ROOT = Path(__file__).resolve().parent.parent
# Per command; each example takes milliseconds, the whole file well under a minute.  A longer hunt:
# OVERLAP_JUNK_EXAMPLES=2000 pytest tests/test_cli_junk.py
EXAMPLES = int(os.environ.get("OVERLAP_JUNK_EXAMPLES", "40"))
JUNK_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------- junk files

@dataclass(frozen=True)
class File:
    """A path made fresh for one example: ``kind`` file (with ``content``), dir, missing,
    under_file (a path whose parent is a file), fifo, device (``/dev/zero``), fresh (a new
    path, for outputs) or slash (a new path ending in ``/``)."""
    kind: str
    content: bytes = b""
    name: str = "junk.json"

    def __repr__(self) -> str:  # a failing example's report: not 100 kB of database
        head = self.content[:40]
        return f"File({self.kind!r}, {head!r}... of {len(self.content)} bytes, name={self.name!r})"

    def make(self, folder: Path) -> str:
        path = folder / f"{len(list(folder.iterdir()))}_{self.name}"
        if self.kind == "file":
            path.write_bytes(self.content)
        elif self.kind == "dir":
            path.mkdir()
        elif self.kind == "under_file":
            path.write_bytes(b"a file")
            path = path / "inner" / self.name
        elif self.kind == "fifo":  # opening it to read or write would wait for the other end
            os.mkfifo(path)
        elif self.kind == "device":
            return "/dev/zero"
        elif self.kind == "slash":  # a folder's name: Path() drops the slash
            return f"{path}/"
        return str(path)


_SCALARS = (st.none() | st.booleans() | st.text(max_size=12)
            | st.integers(-10**500, 10**500) | st.floats(allow_nan=True, allow_infinity=True)
            | st.sampled_from([0, -1, 1e308, -1e308, 1e18, 2**63, 10**40, 10**41, 1e-320]))
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
_CATS = st.sampled_from(["kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "Runtime",
                         "user_annotation", "cpu_op", "cuda_sync", "Trace", "", 7])
_EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "M", "s"]), "cat": _CATS,
     "name": st.sampled_from(["cudaLaunchKernel", "cudaStreamSynchronize", "ProfilerStep#1",
                              "ProfilerStep#" + "9" * 30, "k", "", " "]) | st.text(max_size=6),
     "ts": _SCALARS, "dur": _SCALARS},
    optional={"args": st.fixed_dictionaries({}, optional={"stream": _SCALARS,
                                                          "correlation": _SCALARS}) | _JSON,
              "tid": _SCALARS})
_TIME = (st.floats(-1e18, 1e18) | st.integers(-10**18, 10**18)
         | st.sampled_from([1e18, -1e18, 0, 1e-300]))
# Device work the reader accepts, so that junk beside it reaches the summary and its JSON.
_KERNEL = st.fixed_dictionaries(
    {"ph": st.just("X"), "cat": st.sampled_from(["kernel", "gpu_memcpy", "Memset"]),
     "name": st.text(max_size=6), "ts": _TIME, "dur": st.floats(0, 1e18) | st.integers(0, 10**18),
     "args": st.fixed_dictionaries({"stream": st.integers(-2, 2**63)},
                                   optional={"correlation": st.integers(-5, 10**20)})})


def _step(n: int, ts, dur) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur}


_STEP = st.builds(_step, st.integers(0, 10**25), _TIME, st.floats(0, 1e18))
_META = st.dictionaries(st.sampled_from(["traceName", "deviceProperties", "schemaVersion"]), _JSON,
                        max_size=2)
_TRACE = st.builds(lambda events, meta: dict(meta, traceEvents=events),
                   st.lists(_KERNEL | _STEP | _EVENT | _JSON, max_size=8), _META)
_READABLE = st.builds(lambda events: {"traceEvents": events},
                      st.lists(_KERNEL | _STEP, min_size=1, max_size=8))
_REAL = gzip.decompress((kineto.real_traces()["a100_event_sync"]).read_bytes())


def _dumped(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def _cut(data: bytes, at: int) -> bytes:
    return data[: at % (len(data) + 1)]


_CONTENT = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n, opener: opener * n, st.integers(1, 200_000),
              st.sampled_from([b"[", b'{"a":'])),
    _JSON.map(_dumped),
    _TRACE.map(_dumped),
    _READABLE.map(_dumped),
    _READABLE.map(_dumped),
    st.builds(_cut, st.just(_REAL), st.integers(0, len(_REAL))),
    st.builds(lambda digits: _REAL.replace(b'"ts": 1707417525512162', b'"ts": ' + b"9" * digits, 1),
              st.integers(1, 500)),
)


_STORED = json.loads((TRACES_DIR / "cpu_zos.json").read_text())


def _stored_with(where: tuple, value) -> bytes:
    """The shipped ZOS run, one field (top level, or ``("spans", i, field)``) set to ``value``."""
    data = json.loads(json.dumps(_STORED))
    target = data if len(where) == 1 else data["spans"][where[1] % len(data["spans"])]
    target[where[-1]] = value
    return _dumped(data)


# A stored course timeline with one field junk: export's STORED argument.
_TIMELINE = st.builds(_stored_with, st.sampled_from(
    [("origin_ns",), ("version",), ("spans", 0, "start_ms"), ("spans", 3, "end_ms"),
     ("spans", 7, "round"), ("spans", 9, "cpu_ms"), ("spans", 2, "owner"), ("spans", 5, "lane"),
     ("spans", 4, "stage")]), _SCALARS)


def _maybe_gzip(data: bytes, how: int) -> bytes:
    if how == 1:
        return gzip.compress(data)
    if how == 2:
        return gzip.compress(data)[:-5]  # cut short
    return data


_INPUT_FILE = st.one_of(
    st.builds(File, st.just("file"), st.builds(_maybe_gzip, _CONTENT, st.integers(0, 2))),
    st.builds(File, st.sampled_from(["dir", "missing", "under_file", "fifo", "device"])),
)
_OUTPUT_FILE = st.builds(File, st.sampled_from(["fresh", "fresh", "dir", "under_file", "fifo",
                                                "slash"]),
                         name=st.sampled_from(["out.json", "out.json.gz", "out"]))
# Tokens a learner might type; none starts with -h (argparse prints its help, exit 0, not JSON).
_TOKEN = (st.sampled_from(["", "-", "--", "nan", "inf", "-inf", "1e400", "-1", "0", "1.5",
                           "9" * 60, "\x00", "é", "--bogus", "cpu_zos", "a100_event_sync", "/",
                           "/proc/x/y.json"])
          | st.text(max_size=10)).filter(lambda t: not t.startswith(("-h", "--h")))


# ---------------------------------------------------------------------------- the commands

@dataclass(frozen=True)
class Command:
    """One command line under test.

    ``argv``: a strategy of argument lists, whose items are strings or :class:`File` (made in a
    fresh folder per example); ``claims_json(argv)``: whether its success prints JSON;
    ``stand_ins``: ``(object, attribute, replacement)`` patched around each call, for what would
    start an engine, a server or a grader; ``env``: a strategy of environment variables to set;
    ``notes``: lines it may print on stderr when it succeeds (a note such as "moved aside")."""
    name: str
    main: Callable[[list[str]], int | None] = field(repr=False)
    argv: st.SearchStrategy = field(repr=False)
    claims_json: Callable[[list[str]], bool] = field(repr=False)
    stand_ins: tuple = field(default=(), repr=False)
    env: st.SearchStrategy = field(default_factory=lambda: st.just({}), repr=False)
    notes: int = 0


def _stored_run(mode, args):
    """Stands in for recording a run (seconds of engine work): the shipped ZOS run."""
    return load_trace("cpu_zos")


def _no_engine(*args, **kwargs):
    raise AssertionError("an engine was started: the generator meant every bench argument list "
                         "to hold a bad value")


def _serve_stand_in(store, args, host, port):
    """Stands in for serving (the hub's OAuth and an IOLoop): the store opened, 0."""
    assert store.count() >= 0
    store.db.close()
    return 0


_EXPORT_FLAG = st.sampled_from(["--mode", "--prompts", "--max-new-tokens", "--host-overhead-ms",
                                "--device"])
_EXPORT_VALUE = _TOKEN | st.sampled_from(["serial", "zos", "both", "1", "3", "2.5", "cpu"])
_FLAG_VALUES = st.lists(st.tuples(_EXPORT_FLAG, _EXPORT_VALUE),
                        max_size=3).map(lambda pairs: [x for pair in pairs for x in pair])

SUMMARY_ARGV = st.one_of(
    st.tuples(st.just("summary"), _INPUT_FILE).map(list),
    st.tuples(st.just("summary"), _INPUT_FILE).map(list),
    st.tuples(st.just("summary"), _INPUT_FILE).map(list),
    st.lists(_TOKEN | _INPUT_FILE, max_size=4),
)
EXPORT_ARGV = st.builds(
    lambda out, stored, flags: ["export", out, *stored, *flags],
    _OUTPUT_FILE | _TOKEN,
    st.lists(_INPUT_FILE | st.builds(File, st.just("file"), _TIMELINE)
             | st.sampled_from(["cpu_zos", "cpu_serial_spec4", "no_such_run"]), max_size=1),
    _FLAG_VALUES,
)

# The bench: each flag at most once (a later good value would override a bad one), one bad at least.
BENCH_GOOD = {"--modes": ["serial", "zos", "serial,zos", "zos+spec,serial+spec"],
              "--repeats": ["1", "3"], "--requests": ["1", "16", "200"],
              "--max-new-tokens": ["1", "96"], "--batch-size": ["1", "8"],
              "--num-draft-tokens": ["0", "4"], "--host-overhead-ms": ["0", "2.5"],
              "--temperature": ["0", "0.7"], "--device": ["auto", "cpu", "paced"]}
BENCH_BAD = {"--modes": ["nope", "", "serial,serial", "zos,", ",", "SERIAL", "serial+spec+spec"],
             "--repeats": ["0", "-1", "101", "x", "1.5", "nan", "9" * 50],
             "--requests": ["0", "10001", "x", "-3", "1e3"],
             "--max-new-tokens": ["0", "-5", "x", "1e3", ""],
             "--batch-size": ["0", "4097", "-1", "eight"], "--num-draft-tokens": ["-1", "17", "x"],
             "--host-overhead-ms": ["-1", "nan", "inf", "1e400", "1001", "x", "-0.5"],
             "--temperature": ["-0.1", "nan", "101", "inf", "hot"], "--device": ["tpu", "", "CPU"]}


@st.composite
def bench_argv(draw) -> list[str]:
    flags = draw(st.lists(st.sampled_from(sorted(BENCH_GOOD)), unique=True, max_size=5))
    bad = draw(st.lists(st.sampled_from(sorted(BENCH_BAD)), unique=True, min_size=1, max_size=3))
    pairs = [(f, draw(st.sampled_from(BENCH_GOOD[f]))) for f in flags if f not in bad]
    pairs += [(f, draw(st.sampled_from(BENCH_BAD[f]))) for f in bad]
    argv = []
    for flag, value in draw(st.permutations(pairs)):  # "--x=-1": a value that looks like a flag
        argv += [f"{flag}={value}"] if value.startswith("-") else [flag, value]
    extra = draw(st.lists(st.sampled_from(["--json", "--bogus", "junk"]), max_size=1))
    return argv + extra


def _sqlite_bytes(rows: int) -> bytes:
    verdict = {"notebook": "03_zos_loop", "check": "check_zos_loop", "passed": True,
               "category": "passed", "time": 1.0}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "db.sqlite"
        store = ps.Store(str(path))
        for i in range(rows):
            store.add(f"learner{i}", verdict)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store.db.close()
        return path.read_bytes()


_DB = _sqlite_bytes(200)


def _overwritten(at: int, junk: bytes) -> bytes:
    """The real database with ``junk`` written over it at ``at``."""
    at %= len(_DB)
    return _DB[:at] + junk + _DB[at + len(junk):]


_DB_CONTENT = (st.binary(max_size=200) | st.builds(_cut, st.just(_DB), st.integers())
               | st.builds(_overwritten, st.integers(), st.binary(min_size=1, max_size=64))
               | st.just(_DB) | st.just(b""))
_DB_FILE = st.one_of(
    st.builds(File, st.just("file"), _DB_CONTENT, name=st.just("db.sqlite")),
    st.builds(File, st.sampled_from(["dir", "missing", "under_file"]), name=st.just("db.sqlite")),
)
_SERVICE_FLAGS = st.sampled_from(["--instructors", "teachers", "--guide-url", "/x", "--bogus",
                                  "--guide-file"])
SERVICE_ARGV = st.builds(lambda db, extra: ["--db", db, *extra], _DB_FILE,
                         st.lists(_SERVICE_FLAGS, max_size=2) | st.lists(_TOKEN, max_size=1))
_URL = st.sampled_from(["http://127.0.0.1:10101", "http://hub:port/", "10101", "http://[::1]:8000",
                        "ftp://x:1", "http://h:99999", "", "http://:0"])
_NO_NUL = st.text(max_size=12).filter(lambda t: "\x00" not in t)  # os.environ holds no NUL
SERVICE_ENV = st.fixed_dictionaries({}, optional={"JUPYTERHUB_SERVICE_URL": _URL | _NO_NUL})

PROGRESS_ARGV = st.lists(_INPUT_FILE | _TOKEN.filter(lambda t: not t.startswith("/")),
                         max_size=2)

# DEST relative (the example's fresh folder), so a junk DEST never lays a course out in /.
GRADING_ARGV = st.one_of(
    st.builds(lambda dest, names: ["course", dest, *names],
              _OUTPUT_FILE | _TOKEN.filter(lambda t: not t.startswith("/")),
              st.lists(_TOKEN | st.sampled_from(sorted(grading.POINTS)), max_size=3)),
    st.lists(_TOKEN | st.sampled_from(["course", "annotate", "check"]), max_size=3),
)


def _annotate_stand_in(path):
    """Stands in for rewriting a source notebook's metadata: nothing to change."""
    return False


COMMANDS = [
    Command("trace summary", kineto.main, SUMMARY_ARGV, lambda argv: argv[:1] == ["summary"]),
    Command("trace export", kineto.main, EXPORT_ARGV, lambda argv: True,
            stand_ins=((kineto_cli, "_record", _stored_run),)),
    Command("trace export STORED", kineto.main,
            st.builds(lambda out, stored: ["export", out, stored],
                      st.builds(File, st.just("fresh")),
                      st.builds(File, st.just("file"), _TIMELINE)),
            lambda argv: True),
    Command("bench", bench.main, bench_argv(), lambda argv: "--json" in argv,
            stand_ins=((bench, "Engine", _no_engine),)),
    Command("progress service", ps.main, SERVICE_ARGV, lambda argv: False,
            stand_ins=((ps, "serve", _serve_stand_in),), env=SERVICE_ENV, notes=1),
    Command("progress", progress.main, PROGRESS_ARGV, lambda argv: False),
    Command("grading", grading.main, GRADING_ARGV, lambda argv: False,
            stand_ins=((grading, "annotate", _annotate_stand_in),)),
]


# ---------------------------------------------------------------------------- running one

def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"stdout claims JSON but holds {name}")

    return json.loads(text, parse_constant=refuse)


def invoke(command: Command, argv: list, env: dict) -> tuple[list[str], int, str, str]:
    """Run ``command`` in-process on ``argv`` (its :class:`File` items made in a fresh folder):
    (the argument list as run, exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        args = [a.make(Path(folder)) if isinstance(a, File) else a for a in argv]
        stack.enter_context(contextlib.chdir(folder))  # what a junk OUT writes stays in the folder
        for target, attribute, replacement in command.stand_ins:
            stack.enter_context(mock.patch.object(target, attribute, replacement))
        stack.enter_context(mock.patch.dict(os.environ, env))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = command.main(args)
        except SystemExit as stop:
            code = stop.code
    return args, code, out.getvalue(), err.getvalue()


def check_answer(command: Command, args: list[str], code, out: str, err: str) -> None:
    """The property: exit 2 with one line, or exit 0 with valid JSON where JSON is claimed."""
    said = (f"{command.name} {args!r:.300} -> {code!r}\nstdout: {out[:300]!r}\n"
            f"stderr: {err[:600]!r}")
    assert "Traceback" not in out + err, said
    if code == 2:
        assert out == "" and err.endswith("\n") and err.count("\n") == 1 and err.strip(), said
    elif code == 0:
        if command.claims_json(args):
            _strict_json(out)
        assert err.count("\n") <= command.notes, said
    else:
        raise AssertionError(f"exit status neither 0 nor 2: {said}")


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
@JUNK_SETTINGS
@given(data=st.data())
def test_junk_arguments_and_files_get_one_line_or_valid_json(command, data):
    argv = data.draw(command.argv, label="argv")
    env = data.draw(command.env, label="env")
    check_answer(command, *invoke(command, argv, env))


# ---------------------------------------------------------------------------- bodies and records

_VERDICT = st.fixed_dictionaries(
    {"notebook": st.sampled_from(["03_zos_loop", "x"]),
     "check": st.sampled_from(["check_zos_loop", "x"]), "passed": _SCALARS,
     "category": st.sampled_from(["passed", "no_flush"])},
    optional={"time": _SCALARS, "user": _SCALARS})
_BODY = st.one_of(st.binary(max_size=400), _JSON.map(_dumped), _VERDICT.map(_dumped),
                  st.builds(lambda n, o: o * n, st.integers(1, 16_000),
                            st.sampled_from([b"[", b'{"a":'])))


@JUNK_SETTINGS
@given(body=_BODY)
def test_the_service_answers_any_body_with_a_status_and_stores_what_it_accepts(body):
    code, why, verdict = ps.validate(body, "ada")
    assert code in (201, 400, 403, 413, 422) and isinstance(why, str) and why
    if code == 201:
        store = ps.Store(":memory:")
        store.add("ada", verdict)
        assert store.count() == 1
        json.dumps(store.entries(), allow_nan=False)  # the room's page (api/room) is JSON


@JUNK_SETTINGS
@given(junk=st.lists(st.binary(max_size=80) | _JSON.map(_dumped), max_size=6), torn=st.booleans())
def test_the_record_reads_any_bytes_and_keeps_the_next_verdict(junk, torn):
    from overlap_course.checks.verdict import Verdict

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "progress.jsonl"
        path.write_bytes(b"\n".join(junk) + (b"" if torn else b"\n"))
        mine = progress.your_progress(path)
        assert repr(mine).count("are not verdicts") <= 1 and mine._repr_html_()
        with mock.patch.dict(os.environ, {progress.ENV_FILE: str(path)}), \
                mock.patch.object(progress, "_said", set()):
            os.environ.pop(progress.ENV_URL, None)
            progress.record(Verdict(False, "", "no_flush"), "check_zos_loop", "03_zos_loop")
        entries, _ = progress.read_record(path)
        assert entries[-1]["check"] == "check_zos_loop" and entries[-1]["category"] == "no_flush"


# ---------------------------------------------------------------------------- the whole path

def _python_m(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_junk_through_python_m(tmp_path):
    """Two junk inputs through the interpreter (each start imports torch: seconds); the bench's
    and the service's own are in test_edges_34.py."""
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)
    (tmp_path / "a_file").write_text("x")
    runs = [_python_m("overlap_course.traces.kineto", "summary", str(nested)),
            _python_m("overlap_course.traces.kineto", "export", str(tmp_path / "a_file" / "t.json"),
                      "cpu_zos")]
    for done in runs:
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


def test_the_junk_databases_start_from_a_real_one():
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "db.sqlite"
        path.write_bytes(_DB)
        assert ps.open_store(str(path)).count() == 200
