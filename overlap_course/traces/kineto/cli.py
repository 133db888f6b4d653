"""``python -m overlap_course.traces.kineto summary FILE`` and ``... export OUT.json [STORED]``
(``./run.sh trace ...``): measure a real trace, or write course runs in Kineto's format.

``summary`` reads JSON and imports no engine: torch's import was three quarters of its run
time.  What only ``export`` needs (the engine, its bounds) is imported when export runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from overlap_course.command_line import (FolderLost, Parser, cannot_write, emit, fail,
                                         finite_number, importing, interrupted, locked,
                                         not_an_input, os_problem, out_file, whole_number)
from overlap_course.safe_json import dumps, name_text, quoted, whole_set

from .idle import summary
from .reading import KinetoTrace, read_bounded, real_traces

if TYPE_CHECKING:
    from toy_engine.timeline import Timeline

__all__ = ["main"]


def _exists(stored: str) -> bool:
    """Whether STORED names an existing path (else it may be a shipped name); a path the system
    refuses to look at (a name too long, a symbolic link loop: not "no recorded trace") is
    refused naming STORED."""
    try:
        os.stat(stored)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise ValueError(f"STORED {quoted(stored, PATH_CHARS)} cannot be read: "
                         f"{exc.strerror or exc}") from None


def _stored_file(stored: str) -> Path:
    """The file STORED reads: the path itself, or the shipped timeline a name stands for
    (``cpu_zos`` -> ``overlap_course/traces/cpu_zos.json``), refused unless it is one
    (:func:`shipped_trace_file`: ``/tmp/x/big`` read ``/tmp/x/big.json``)."""
    from overlap_course.traces.recorded import shipped_trace_file  # imports the engine

    if _exists(stored):
        return Path(stored)
    return shipped_trace_file(stored)


def _load_timeline(source: str) -> Timeline:
    """A stored course timeline: a path, or the name of a shipped one (``cpu_zos``), read as a
    trace is (:func:`read_bounded`): a FIFO or a device refused, not waited on, and at most
    256 MiB (a file of gigabytes was read whole: a ``MemoryError``)."""
    from toy_engine.timeline import Timeline

    from .exporting import check_exportable

    where = f"STORED {quoted(source, PATH_CHARS)}"
    raw = read_bounded(_stored_file(source), where)
    try:
        timeline = Timeline.from_json(raw)
        check_exportable(timeline)  # refused here, naming STORED, not the file being written
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return timeline


def _record(mode: str, args) -> Timeline:
    """A fresh run of the engine in ``mode``: what ``export`` writes when given no stored timeline."""
    from overlap_course.measure.bench import default_workload  # the engine (torch) only when recording
    from toy_engine.config import EngineConfig
    from toy_engine.device import DeviceError
    from toy_engine.engine import Engine

    config = EngineConfig(mode=mode, device=args.device, host_overhead_ms=args.host_overhead_ms)
    try:
        with Engine(config) as engine:
            engine.generate(default_workload(args.prompts), max_new_tokens=args.max_new_tokens)
            return engine.timeline
    except DeviceError as exc:  # its device process died: nothing to export
        raise RunFailed(f"the {mode} run failed: {exc}") from None


class RunFailed(RuntimeError):
    """A recording that failed on the way (not bad input): one line and exit status 1."""


def _out_path(out: Path, mode: str) -> Path:
    """``OUT_serial.json`` beside ``OUT.json`` (``.json.gz`` kept whole) when both modes are written."""
    suffix = "".join(out.suffixes[-2:]) if out.name.endswith(".json.gz") else out.suffix or ".json"
    stem = out.name[: len(out.name) - len(suffix)] if out.name.endswith(suffix) else out.name
    return out.with_name(f"{stem}_{mode}{suffix}")


PROG = "python -m overlap_course.traces.kineto"
#: Bounds of what ``export`` records (the engine refuses more, but only after starting).
MAX_PROMPTS = 10_000
#: The most characters of a path that a message quotes.
PATH_CHARS = 200
#: What ``export`` records when given no STORED timeline, unless its options say otherwise.
RECORDING = {"mode": "both", "prompts": 8, "max_new_tokens": 32, "host_overhead_ms": 0.0,
             "device": "auto"}


def _parser() -> Parser:
    p = Parser(prog=PROG, description="PyTorch-profiler (Kineto) traces: measure one, or export "
                                      "course runs.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Subcommand)
    s = sub.add_parser("summary", help="device idle overall and per stream, as JSON")
    s.add_argument("file", help=f"a Kineto trace (.json or .json.gz) or a shipped one: "
                                f"{', '.join(real_traces())}")
    sub.add_parser("export", help="write course runs as Kineto JSON", options=_export_options)
    return p


class _Subcommand(Parser):
    """A subcommand whose arguments are added when it is parsed (``export --help`` too):
    export's name the engine's bounds, and importing the engine is no part of ``summary``."""

    def __init__(self, *args, options=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._options = options

    def parse_known_args(self, args=None, namespace=None):
        if self._options is not None:
            self._options, add = None, self._options
            add(self)
        return super().parse_known_args(args, namespace)


def _export_options(e: Parser) -> None:
    with importing(PROG):  # the engine, and torch, imported first here
        from toy_engine.config import DEVICES, MAX_HOST_OVERHEAD_MS
        from toy_engine.model import GPTConfig

    e.add_argument("out", help="output file (.json or .json.gz); recording both modes writes "
                               "OUT_serial and OUT_zos")
    e.add_argument("stored", nargs="?", help="convert this stored course timeline (path, or a "
                                             "shipped name like cpu_zos) instead of recording")
    # What a recording reads: left unset unless given (RECORDING holds the defaults), so that
    # one given with STORED is seen and refused (_recording_options).
    unset = argparse.SUPPRESS
    e.add_argument("--mode", choices=("serial", "zos", "both"), default=unset)
    e.add_argument("--prompts", type=whole_number(1, MAX_PROMPTS), default=unset)
    # A prompt takes at least one of the model's positions; the rest can be new tokens.
    e.add_argument("--max-new-tokens", type=whole_number(1, GPTConfig.context_len - 1),
                   default=unset)
    e.add_argument("--host-overhead-ms", type=finite_number(0.0, MAX_HOST_OVERHEAD_MS),
                   default=unset)
    e.add_argument("--device", choices=DEVICES, default=unset)


def _recording_options(args) -> None:
    """The options of a recording (:data:`RECORDING`) refused with STORED, which is converted
    as it was recorded (they were taken and ignored: the stored run written, exit 0); without
    STORED, each not given is set to its default."""
    given = [f"--{name.replace('_', '-')}" for name in RECORDING if name in vars(args)]
    if args.stored is not None and given:
        raise ValueError(f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} to "
                         f"recording only: STORED {quoted(args.stored, PATH_CHARS)} is a stored "
                         f"run, converted as it is; leave {'them' if len(given) > 1 else 'it'} "
                         f"out, or leave STORED out to record a run")
    for name, value in RECORDING.items():
        vars(args).setdefault(name, value)


def _writable(text: str, stored: str | None) -> Path:
    """OUT as a path, refused before anything is recorded (a run takes seconds) if it cannot be
    a file (:func:`out_file`) or is the STORED timeline itself (converting it would overwrite
    the input)."""
    if text.strip() and stored is not None and not stored.strip():
        raise ValueError("STORED is empty: give a stored timeline's path or a shipped name "
                         "(cpu_zos), or leave it out to record a run")
    out = out_file(text)
    if stored is not None:
        not_an_input(text, "OUT", {_stored_file(stored): "the STORED timeline"})
    return out


def _targets(out: Path, modes) -> dict:
    """mode -> the file it is written to: OUT itself for one run, else OUT_serial / OUT_zos,
    each refused (:func:`out_file`) before anything is recorded, as OUT is."""
    if len(modes) == 1:
        return {modes[0]: out}
    return {m: out_file(str(_out_path(out, m)), f"the {m} run's file") for m in modes}


def _export_all(runs: dict, targets: dict, names: dict, held) -> dict:
    """Every run exported to its file, all or none (``safe_json.whole_set``): each is written
    and measured under a temporary name beside its target, and they are renamed into place
    only when all are.  The export's report.  ``names``: how a refusal names each run (STORED,
    or the mode recorded), never by the temporary file, which is gone when the message is
    read.  ``held``: raises unless OUT's folder is still the one locked (nothing is made
    there: one made again was another export's to lock and write)."""
    from .exporting import export

    report = {}
    try:
        with whole_set(check=held) as files:
            for mode, tl in runs.items():
                path = targets[mode]
                suffix = ".json.gz" if path.name.endswith(".gz") else ".json"
                try:
                    tmp = Path(files.part(path, suffix))
                    export(tl, tmp, name=path.name)
                except OSError as exc:
                    held()  # the folder removed while written: that, not the file, is the news
                    raise cannot_write(path, exc) from None
                except FolderLost:
                    raise
                except ValueError as exc:  # the timeline refused (kineto_events)
                    raise ValueError(f"{names[mode]}: {exc}") from None
                try:
                    measured = summary(KinetoTrace(tmp, where="its export"))
                except ValueError as exc:
                    raise ValueError(f"{names[mode]} cannot be exported as a trace the course "
                                     f"reads back ({exc}); nothing was written") from None
                report[name_text(path)] = {
                    "mode": tl.meta.mode,
                    "course_device_idle_fraction": round(tl.device_idle_fraction(), 6),
                    "summary_device_idle_fraction": measured["device_idle_fraction"]}
    except OSError as exc:  # a rename into place: whole_set names the target
        raise cannot_write(exc.filename, exc) from None
    return report


def _locked(out: Path) -> locked:
    """OUT's folder locked for this export, before a run is recorded (``command_line.locked``,
    the site build's lock): two exports on one OUT each renamed their pair into place, which
    left one run's serial file beside the other's ZOS file, and both reported the pair."""
    return locked(out.parent, f"OUT {quoted(str(out), PATH_CHARS)}: its folder is being "
                              f"written by another trace export (or a site build) running now: "
                              f"wait for it to end, or name OUT in another folder; nothing was "
                              f"written", shown=out)


def _summary_text(source) -> str:
    """The summary as JSON, its ``source`` a file name written as :func:`name_text` writes it."""
    s = summary(source)
    return dumps({**s, "source": name_text(s["source"])},
                 f"the summary of {quoted(source, PATH_CHARS)}", indent=2)


def _export(args) -> dict:
    """The export's report: OUT checked, the STORED timeline read, OUT's folder locked, then
    the runs recorded (seconds) and written."""
    _recording_options(args)
    out = _writable(args.out, args.stored)
    if args.stored is not None:
        timeline = _load_timeline(args.stored)
        targets, run = {None: out}, lambda mode: timeline
        names = {None: f"STORED {quoted(args.stored, PATH_CHARS)}"}
    else:
        modes = ("serial", "zos") if args.mode == "both" else (args.mode,)
        targets = _targets(out, modes)  # every file checked before a run is recorded
        run, names = (lambda mode: _record(mode, args)), {m: f"the {m} run" for m in modes}
    with _locked(out) as lock:
        runs = {mode: run(mode) for mode in targets}
        return _export_all(runs, targets, names, lambda: lock.still_held("OUT's folder"))


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "summary":
            emit(_summary_text(args.file))
            return 0
        emit(dumps(_export(args), "the export's report", indent=2))
        return 0
    except ValueError as exc:
        return fail(PROG, exc)
    except OSError as exc:  # a path the system refuses to look at (a name too long...)
        return fail(PROG, os_problem(exc))
    except KeyboardInterrupt:  # the engine's `with` closed it on the way out
        return interrupted(PROG)
    except RunFailed as exc:
        fail(PROG, exc)
        return 1
