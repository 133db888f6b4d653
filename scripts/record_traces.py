"""Record the timelines shipped in ``overlap_course/traces/`` (read with ``figures.load_trace``).

    python scripts/record_traces.py                 # auto device: CUDA if present, else CPU stand-in
    python scripts/record_traces.py --device cuda   # on a GPU machine: CUDA-event timelines
    python scripts/record_traces.py --drafts 4 --host-overheads 0   # the speculative pair (04's bench)

For each host overhead (``--host-overheads``, default 0 and 2 ms/round) and mode it
starts one engine, does a warm-up run (the first forward is cold and would dominate the
picture), then ``--repeats`` recorded runs, and keeps the least contended one (the
one not flagged busy with the highest CPU share of the device process and host loop,
whichever is lower; see ``overlap_course.measure.contention``), so one unlucky slice of a shared machine does not become the
course's example.  The
result is written to ``overlap_course/traces/<device>_<mode>[_spec<K>][_overhead<H>ms].json``
(``<device>`` is ``cpu`` or ``cuda``); its ``meta`` carries the engine's settings, workload
and stats, and a :class:`~overlap_course.traces.recorded.Recording` (how, where, when and at
which commit it was recorded, and the kept run's contention meter).

These traces are the notebooks' fallback when a learner's machine is busy, so they must
come from a quiet one: a kept run whose device process got less than
``BUSY_RUN_CPU_SHARE`` of its wall time as CPU (or whose host loop did, or during which
other programs used more than ``BUSY_OTHERS_CPUS``) is refused (exit status 1, nothing
written) unless ``--allow-busy``.  ``--out`` is made and locked before any run (the lock of
trace export and the site build: one writing it refuses the other), and the traces are written
all or none.  Keep the workload small: a trace is a teaching
picture, not a benchmark (< 200 KB).
"""

from __future__ import annotations

import _signal  # loaded at Python's start: no import before SIGINT is held

# POSIX: a Ctrl-C while the course package imports waits for interruptible's handler
_held = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(
    _signal, "pthread_sigmask") else None
from overlap_course.ctrl_c import interruptible  # noqa: E402

interruptible(__name__, "record_traces", _held)  # first: a Ctrl-C while torch imports is one line

import argparse  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from toy_engine import (CharTokenizer, Engine, EngineConfig, GPTConfig, TinyGPT,  # noqa: E402
                        load_model)
from toy_engine.device import picks_cuda  # noqa: E402
from overlap_course.command_line import (Parser, cannot_write, fail, finite_number,  # noqa: E402
                                         locked, out_folder, progress, run, whole_number)
from overlap_course.measure.bench import (MAX_NEW_TOKENS, MAX_REPEATS, MAX_REQUESTS,  # noqa: E402
                                          default_workload)
from overlap_course.measure.machine import machine_report  # noqa: E402
from overlap_course.safe_json import (quoted, refuse_unwritable, signals_held,  # noqa: E402
                                      whole_set)
from toy_engine.config import MAX_BATCH_SIZE, MAX_DRAFT_TOKENS, MAX_HOST_OVERHEAD_MS  # noqa: E402
from toy_engine.model import CHECKPOINT  # noqa: E402
from overlap_course.traces.recorded import (RECORDED_WORKLOAD, TRACES_DIR, Recording,  # noqa: E402
                                            recording, trace_name)
from overlap_course.measure.contention import (BUSY_OTHERS_CPUS, BUSY_RUN_CPU_SHARE,  # noqa: E402
                                               contention)

REPO = Path(__file__).resolve().parent.parent


def _model():
    try:
        model, alphabet = load_model()
        return model, CharTokenizer(alphabet), f"checkpoint {CHECKPOINT.name}"
    except FileNotFoundError:
        tok = CharTokenizer()
        return TinyGPT(GPTConfig(vocab_size=tok.vocab_size)), tok, "untrained TinyGPT (no checkpoint yet)"


def _commit() -> str | None:
    """The checkout's commit, with "+dirty" when tracked files differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("+dirty" if dirty else "")


def _machine() -> dict:
    report = machine_report()
    info = dict(node=platform.node(), platform=platform.platform(), python=platform.python_version(),
                cpus=report["cpu_count"], usable_cpus=report["allowed"], affinity=report["affinity"],
                cgroup_quota=report["cgroup_quota"], load_average=[round(x, 2) for x in os.getloadavg()],
                torch=str(torch.__version__))
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def record(mode: str, overhead: float, args, model, tokenizer, model_desc: str) -> tuple:
    """Record one mode at one host overhead; returns (Timeline, busy?)."""
    config = EngineConfig(mode=mode, device=args.device, max_batch_size=args.batch_size,
                          num_draft_tokens=args.drafts, host_overhead_ms=overhead,
                          race_check=False)
    prompts = default_workload(args.requests)
    with Engine(config, model=model, tokenizer=tokenizer) as engine:
        engine.generate(prompts, max_new_tokens=args.max_new_tokens)  # warm-up, not kept
        runs = []
        for _ in range(args.repeats):
            engine.generate(prompts, max_new_tokens=args.max_new_tokens)
            runs.append((engine.stats.tokens_per_s, engine.timeline, contention(engine.timeline)))
    # The quietest run: a CUDA run has no CPU share, there the median tokens/s is kept.
    if all(r[2]["device_cpu_share"] is not None for r in runs):
        _, timeline, meter = max(runs, key=lambda r: (not r[2]["busy"],
                                                      min(r[2]["device_cpu_share"], r[2]["host_cpu_share"])))
        kept = (f"the least contended of {args.repeats} runs (not busy, then highest min(device, host) CPU "
                f"share) after 1 warm-up")
    else:
        median = statistics.median_low([tps for tps, _, _ in runs])
        _, timeline, meter = next(r for r in runs if r[0] == median)
        kept = f"median tokens/s of {args.repeats} runs after 1 warm-up"
    made = Recording(
        command=" ".join(shlex.quote(a) for a in ["python"] + sys.argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=_commit(), machine=_machine(), torch=str(torch.__version__), model=model_desc,
        prompts="overlap_course.measure.bench.default_workload", race_check=False, kept=kept, nice=os.nice(0),
        tokens_per_s_all_runs=[round(r[0], 1) for r in runs],
        device_cpu_share_all_runs=[r[2]["device_cpu_share"] for r in runs], contention=meter)
    timeline.meta.annotations["recorded"] = asdict(made)
    return timeline, bool(meter["busy"])


PROG = "record_traces"


def _parser() -> Parser:
    """Every argument bounded as the bench bounds it: junk is one line before an engine starts
    (``--repeats 0`` was ``max()`` of nothing after a warm-up, ``--batch-size 0`` a traceback)."""
    p = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--modes", nargs="+", default=["serial", "zos"], choices=["serial", "zos"])
    # The notebooks' live comparisons' workload: a RECORDED row beside a live one compares like with like.
    p.add_argument("--requests", type=whole_number(1, MAX_REQUESTS),
                   default=RECORDED_WORKLOAD["requests"])
    p.add_argument("--max-new-tokens", type=whole_number(1, MAX_NEW_TOKENS),
                   default=RECORDED_WORKLOAD["max_new_tokens"])
    p.add_argument("--batch-size", type=whole_number(1, MAX_BATCH_SIZE),
                   default=RECORDED_WORKLOAD["batch_size"])
    p.add_argument("--drafts", type=whole_number(0, MAX_DRAFT_TOKENS), default=0)
    p.add_argument("--host-overheads", type=finite_number(0.0, MAX_HOST_OVERHEAD_MS), nargs="+",
                   default=[0.0, 2.0],
                   help="host overheads (ms/round) to record; 0 writes <device>_<mode>.json")
    p.add_argument("--repeats", type=whole_number(1, MAX_REPEATS), default=5)
    p.add_argument("--allow-busy", action="store_true",
                   help="write traces even when the kept run was busy (they say so in meta)")
    p.add_argument("--out", default=str(TRACES_DIR))
    return p


class BusyMachine(RuntimeError):
    """A kept run was busy and ``--allow-busy`` was not given: exit status 1, nothing written."""


def _no_repeats(args) -> None:
    """Refuse, before any work, two runs that would write one file (the later replaced the
    earlier without a word): a mode or an overhead named twice, or two overheads that the file
    name rounds to one (:func:`trace_name` keeps 6 significant digits)."""
    for mode in args.modes:
        if args.modes.count(mode) > 1:
            raise ValueError(f"--modes names {mode} twice: name each mode at most once")
    named: dict[str, float] = {}
    for overhead in args.host_overheads:
        stem = trace_name("serial", overhead)
        first = named.get(stem)
        if first is None:
            named[stem] = overhead
        elif first == overhead:  # -0 and 0: two spellings, one value
            twice = (f"names {first:g} twice" if f"{first:g}" == f"{overhead:g}" else
                     f"{first:g} and {overhead:g} are the same overhead")
            raise ValueError(f"--host-overheads {twice}: name each overhead at most once")
        else:
            raise ValueError(f"--host-overheads {first!r} and {overhead!r} would write one file "
                             f"(its name keeps 6 digits: ..._overhead{overhead:g}ms.json): name "
                             f"overheads that differ in their first 6 digits")


def _targets(args) -> dict:
    """(host overhead, mode) -> the file its run is written to, a folder or a pipe at each
    refused before any run (``refuse_unwritable``, as ``whole_set.part`` refuses it when
    writing, and profile_cuda before recording): it was refused only after every run was
    recorded (minutes).  The device is the engine's: ``auto`` is CUDA when torch sees one."""
    cuda = picks_cuda(args.device)
    targets = {}
    for overhead in args.host_overheads:
        for mode in args.modes:
            stem = trace_name(mode, overhead, "cuda" if cuda else "cpu", args.drafts)
            targets[overhead, mode] = path = args.out / f"{stem}.json"
            refuse_unwritable(path, quoted(str(path), 200))
    return targets


def _record_all(args, targets: dict) -> list:
    """Every run recorded, (timeline, its file) each; ``BusyMachine`` if any ran busy."""
    model, tokenizer, desc = _model()
    recorded, busy = [], []
    for (overhead, mode), path in targets.items():
        timeline, was_busy = record(mode, overhead, args, model, tokenizer, desc)
        c = recording(timeline).contention
        progress(f"{path.stem}: {timeline.meta.stats.tokens_per_s:.0f} tok/s, CPU share device "
                 f"{c['device_cpu_share']:.2f} host {c['host_cpu_share']:.2f}, other programs "
                 f"used {c['others_cpus']} CPUs, busy {c['busy']}")
        recorded.append((timeline, path))
        if was_busy:
            busy.append(path.stem)
    if busy and not args.allow_busy:
        raise BusyMachine(f"not written: {', '.join(busy)} ran on a busy machine (a CPU share "
                          f"below {BUSY_RUN_CPU_SHARE:.0%}, or other programs above "
                          f"{BUSY_OTHERS_CPUS:g} CPUs); record on a quiet machine, or pass "
                          f"--allow-busy")
    return recorded


def _write(recorded: list, held) -> list[Path]:
    """The traces written all or none (``safe_json.whole_set``): a full disk leaves ``--out`` as
    it was, not a set from two recordings; a Ctrl-C waits until they are written (minutes of
    recording are not thrown away for a moment's writing).  ``held`` raises if ``--out`` was
    removed or replaced meanwhile: one made again is another command's (``locked``).  A
    write's ``OSError`` (a full disk) names no file: it is refused naming the file, as the
    trace export's is (``cannot_write``)."""
    try:
        with signals_held(), whole_set(check=held) as files:
            for timeline, path in recorded:
                try:
                    Path(files.part(path, ".json")).write_text(timeline.to_json(),
                                                               encoding="utf-8")
                except OSError as exc:
                    held()  # the folder removed while written: that, not the file, is the news
                    raise cannot_write(path, exc) from None
    except OSError as exc:  # a rename into place: whole_set names the target
        raise cannot_write(exc.filename, exc) from None
    return [path for _, path in recorded]


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:  # junk, a repeat, an --out that cannot be made or is being written: before any work
        args.out = out_folder(args.out)
        _no_repeats(args)
        targets = _targets(args)  # every file checked before a run is recorded
        busy = (f"--out {quoted(str(args.out), 200)} is being written by another command running "
                f"now (a trace export, a site build, a recording): wait for it to end, or name "
                f"another --out; nothing was written")
        with locked(args.out, busy) as lock:  # --out removed again if made for nothing
            paths = _write(_record_all(args, targets), lambda: lock.still_held("--out"))
    except ValueError as exc:  # ... or the engine refused the workload (a prompt too long)
        return fail(PROG, exc)
    except BusyMachine as exc:
        print(exc, file=sys.stderr)
        return 1
    for path in paths:
        size = path.stat().st_size
        print(f"{path}  {size / 1024:.1f} KB")
        if size > 200_000:
            print(f"warning: {path.name} is over 200 KB; record a shorter run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run(PROG, main)  # Ctrl-C: one line, 130 (a second one ends it at once)
