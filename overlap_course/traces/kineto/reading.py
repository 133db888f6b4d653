"""Reading real traces: the PyTorch profiler's (Kineto's) Chrome-trace JSON, checked.

Practitioners check overlap in traces written by ``torch.profiler`` and opened in Perfetto
(https://ui.perfetto.dev) or ``chrome://tracing``.  :func:`read_trace` loads one (plain or
gzip JSON), :class:`KinetoTrace` keeps the events the course measures, and says what is
wrong with anything that is not a trace.  Plain Python (json, zlib).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from overlap_course import safe_json

__all__ = ["REAL_TRACES_DIR", "CUDA_TRACES_DIRS", "real_traces", "cuda_profiles", "read_trace", "KinetoTrace",
           "is_launch_call", "is_sync_call"]

#: ``overlap_course/traces``: ``recorded.TRACES_DIR``, not imported (recorded imports the engine).
TRACES_DIR = Path(__file__).parent.parent
#: The real A100 traces shipped with the package (HTA's public test data, MIT; README.md there).
REAL_TRACES_DIR = TRACES_DIR / "a100"

#: Kineto's categories of device work, and the course stage each becomes.
DEVICE_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
               "gpu_memset": "memset", "Memset": "memset"}
#: Host-side API calls (each may carry the correlation id of the device work it launched).
HOST_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")
_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d{1,18})$")  # a round number, not 5000 digits
_LAUNCH_CALLS = re.compile(r"^(cuda|cu)(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|GraphLaunch|"
                           r"MemcpyAsync|MemsetAsync|Memcpy(HtoD|DtoH|DtoD)Async|MemsetD\w*Async)(_v\d+)?$")


def is_launch_call(name: str) -> bool:
    """A host call that queues device work and returns at once (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...)."""
    return bool(_LAUNCH_CALLS.match(name))


def is_sync_call(name: str) -> bool:
    """A host call that blocks until the device has done something (``cudaStreamSynchronize``, ...)."""
    return "Synchronize" in name


def real_traces() -> dict[str, Path]:
    """The shipped real traces: name (``a100_event_sync``, ...) -> path."""
    return {p.name[: -len(".json.gz")]: p for p in sorted(REAL_TRACES_DIR.glob("*.json.gz"))}


#: Where the lesson (notebook 06) looks for torch.profiler traces of the CUDA engine, in order:
#: shipped ones, then what ``scripts/gpu_check.sh`` (``scripts/profile_cuda.py``) just wrote.
CUDA_TRACES_DIRS = (TRACES_DIR / "cuda", TRACES_DIR.resolve().parents[1] / "artifacts" / "gpu")


def cuda_profiles(dirs=CUDA_TRACES_DIRS) -> dict[str, Path]:
    """torch.profiler traces of the CUDA engine, ``{"serial": path, "zos": path}``, from the first
    folder holding both ``torch_profile_serial.json.gz`` and ``torch_profile_zos.json.gz``; {} if none."""
    for folder in dirs:
        paths = {mode: Path(folder) / f"torch_profile_{mode}.json.gz" for mode in ("serial", "zos")}
        if all(p.is_file() for p in paths.values()):
            return paths
    return {}


def _resolve(source) -> Path:
    if isinstance(source, str) and source in real_traces():
        return real_traces()[source]
    return Path(source)


#: The most bytes a trace file may have, and the most its gzip may unpack to: far above the
#: shipped traces (under 1 MiB unpacked) and a torch.profiler trace of a few steps (tens of
#: MiB), and below what would exhaust memory while reading it (a gzip bomb, /dev/zero): parsed,
#: 256 MiB of JSON is already gigabytes of Python objects.
MAX_TRACE_BYTES = 256 << 20
_MIB = 1 << 20


#: The most characters of a path that a message quotes.
PATH_CHARS = 200


def _too_big(where: str, what: str) -> ValueError:
    return ValueError(f"{where} {what} more than {MAX_TRACE_BYTES // _MIB} MiB, the most a "
                      f"trace read here may have (the shipped ones are under 1 MiB): profile "
                      f"fewer steps (torch.profiler's schedule) and save that trace")


def read_bounded(path: Path, where: str) -> bytes:
    """The file's bytes (gzip unpacked, told apart by content), at most
    :data:`MAX_TRACE_BYTES` of either, so a file that never ends or unpacks to gigabytes is
    refused in bounded memory instead of a ``MemoryError``."""
    try:
        f = safe_json.open_regular(path, where)  # a FIFO or a device: refused, not waited on
    except safe_json.NotAFile:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ValueError(f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}") from None
    with f:
        try:
            raw = f.read(MAX_TRACE_BYTES + 1)
        except OSError as exc:  # opened, then failed (a bad disk): said as the open is
            raise ValueError(f"cannot read {where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_TRACE_BYTES:
        raise _too_big(where, "has")
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return _gunzip(raw, where)
    except (EOFError, zlib.error) as exc:
        raise ValueError(f"{where} is a truncated or corrupt gzip file ({exc})") from None


#: The most gzip members a trace file may have: one is what a profiler writes, a few what
#: ``cat a.json.gz b.json.gz`` makes; 400,000 empty ones are 8 MB that took minutes to walk.
MAX_GZIP_MEMBERS = 1000
_GZIP_FEED = 64 << 10  # bytes handed to zlib at a time
_NOT_NUL = re.compile(rb"[^\0]")


def _gunzip(packed: bytes, where: str) -> bytes:
    """``packed`` unpacked, member after member, at most :data:`MAX_TRACE_BYTES` of it and
    :data:`MAX_GZIP_MEMBERS` members.  Fed to zlib :data:`_GZIP_FEED` bytes at a time: at each
    member's end zlib copies what it was fed past that end, so feeding it the whole rest (as
    ``gzip.decompress`` does) made a file of many tiny members quadratic: 160,000 empty
    members (3.2 MB) took 32 s here; fed in pieces, a member costs at most one piece."""
    view, at, out, size, members = memoryview(packed), 0, [], 0, 0
    while (found := _NOT_NUL.search(packed, at)) is not None:  # gzip pads members with NULs
        at, members = found.start(), members + 1
        if members > MAX_GZIP_MEMBERS:
            raise ValueError(f"{where} has more than {MAX_GZIP_MEMBERS} gzip members (a trace "
                             f"is one; files joined by cat, a few): not a trace")
        unpacker = zlib.decompressobj(wbits=31)
        while not unpacker.eof:
            if at >= len(packed):
                raise EOFError("the file ends inside a gzip member")
            piece = view[at:at + _GZIP_FEED]
            out.append(unpacker.decompress(piece))
            size += len(out[-1])
            if size > MAX_TRACE_BYTES:
                raise _too_big(where, "unpacks to")
            at += len(piece) - len(unpacker.unused_data)
    return b"".join(out)


def read_trace(source, where: str | None = None) -> dict:
    """Load a Chrome-trace JSON document: a path (plain or gzip JSON, told apart by content,
    not by name), a shipped trace's name (``"a100_event_sync"``), or an already loaded dict.

    Anything that is not a trace raises ``ValueError`` saying what is wrong with it, naming
    it ``where`` (default: "trace file PATH"; an export reading back its temporary file names
    what it exports instead).
    """
    if isinstance(source, dict):
        data, where = source, where or "trace"
    else:
        if not isinstance(source, (str, Path)) or not str(source).strip():
            raise ValueError(f"a trace is a file path, a shipped trace name ({', '.join(real_traces())}) "
                             f"or a dict, got {safe_json.quoted(source)}")
        path = _resolve(source)
        where = where or f"trace file {safe_json.quoted(str(path), PATH_CHARS)}"
        raw = read_bounded(path, where)
        if not raw.strip():
            raise ValueError(f"{where} is empty")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValueError(f"{where} is neither gzip nor UTF-8 text: not a JSON trace") from None
        try:
            data = safe_json.loads(text, where)
        except safe_json.JSONRefused as exc:
            raise ValueError(f"{exc}; a truncated trace, or not a trace?") from None
    if isinstance(data, list):  # the Chrome trace format's "JSON array" form
        data = {"traceEvents": data}
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold a JSON object with 'traceEvents', got a {type(data).__name__}")
    if "traceEvents" not in data:
        keys = ", ".join(safe_json.quoted(k, 40) for k in sorted(map(str, data))[:8]) or "none"
        raise ValueError(f"{where} has no 'traceEvents' (its keys: {keys}): not a Chrome/Kineto trace")
    if not isinstance(data["traceEvents"], list):
        raise ValueError(f"{where}: 'traceEvents' must be a list of events, got a "
                         f"{type(data['traceEvents']).__name__}")
    return data


@dataclass(frozen=True)
class Event:
    index: int           # position in traceEvents
    cat: str
    name: str
    ts: float            # us
    end: float           # us
    stream: int | None   # args.stream (None: absent)
    correlation: int | None

    @property
    def dur(self) -> float:
        return self.end - self.ts


#: The largest time a trace may hold, in microseconds (about 31,700 years): sums of such times
#: stay finite floats, so every figure of a summary is a finite number (JSON has no Infinity).
MAX_TIME_US = 1e18


def _number(value, what: str) -> float:
    """A finite time in microseconds, within +-MAX_TIME_US (a 400-digit int is refused here,
    not met as an OverflowError later)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a finite number of microseconds, got "
                         f"{safe_json.quoted(value, 40)}")
    if not -MAX_TIME_US <= value <= MAX_TIME_US:  # NaN and infinities fail this too
        shown = (f"{value:.3g}" if isinstance(value, float)
                 else f"an integer of {value.bit_length()} bits")
        raise ValueError(f"{what} is {shown}: a time must be a finite number of microseconds "
                         f"within +-{MAX_TIME_US:g}")
    return float(value)


#: Stream and correlation ids are 64-bit integers; anything larger is not an id.
_ID_LIMIT = 2**64


def _int_or_none(value) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < _ID_LIMIT:
        value = int(value)
    elif isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value.strip()):
        value = int(value)
    return value if isinstance(value, int) and abs(value) < _ID_LIMIT else None


def _event(i: int, ev, where: str) -> Event | None:
    """``traceEvents[i]`` as an :class:`Event` if it is a complete event the course reads (None
    for flows, metadata, instants and the profiler's own span); a ValueError if it is malformed."""
    if not isinstance(ev, dict):
        raise ValueError(f"{where}: traceEvents[{i}] is not an object (got {ev!r:.60})")
    if "dur" not in ev or ev.get("cat") is None or ev.get("ph", "X") != "X" or ev.get("cat") == "Trace":
        return None
    cat, name = ev["cat"], ev.get("name", "")
    kind = str(cat)
    kind = safe_json.printable(kind[:40]) + ("..." if len(kind) > 40 else "")
    label = f"{where}: traceEvents[{i}] ({kind} {safe_json.quoted(name, 40)})"
    if not isinstance(cat, str) or not isinstance(name, str):
        raise ValueError(f"{label}: 'cat' and 'name' must be strings")
    ts = _number(ev.get("ts"), f"{label}: 'ts'")
    dur = _number(ev["dur"], f"{label}: 'dur'")
    if dur < 0:
        raise ValueError(f"{label}: 'dur' is negative ({dur})")
    args = ev.get("args", {})
    if not isinstance(args, dict):
        raise ValueError(f"{label}: 'args' must be an object, got {type(args).__name__}")
    stream = _int_or_none(args.get("stream"))
    if cat in DEVICE_CATS:
        if "stream" in args and stream is None:
            raise ValueError(f"{label}: args.stream must be an integer, got "
                             f"{safe_json.quoted(args['stream'])}")
        if stream is None:
            stream = _int_or_none(ev.get("tid"))
        if stream is None:
            raise ValueError(f"{label}: device work without a stream (no args.stream, no integer tid)")
    corr = _int_or_none(args.get("correlation"))
    return Event(i, cat, name, ts, ts + dur, stream, corr if corr is not None and corr >= 0 else None)


class KinetoTrace:
    """A parsed Kineto trace: the events the course reads, checked.

    ``device``: kernels / memcpys / memsets (each with a stream); ``on_stream``: every
    complete event with a stream id other than -1 (what HTA's temporal breakdown counts);
    ``host``: runtime and driver calls; ``steps``: ``ProfilerStep#N`` annotations;
    ``annotations``: the other user annotations; ``launch_ts``: correlation id -> start of
    the host call that carries it.
    """

    def __init__(self, source, where: str | None = None) -> None:
        data = read_trace(source, where)
        self.source = "trace" if isinstance(source, dict) else str(_resolve(source))
        #: How messages name it: quoted, escaped, bounded (``where``: :func:`read_trace`).
        self.where = where or ("trace" if isinstance(source, dict)
                               else f"trace file {safe_json.quoted(self.source, PATH_CHARS)}")
        self.meta = {k: v for k, v in data.items() if k != "traceEvents"}
        self.device: list[Event] = []
        self.on_stream: list[Event] = []
        self.host: list[Event] = []
        self.steps: list[tuple[int, Event]] = []
        self.annotations: list[Event] = []
        self.launch_ts: dict[int, float] = {}
        where = self.where
        for i, ev in enumerate(data["traceEvents"]):
            e = _event(i, ev, where)
            if e is None:
                continue
            if e.stream is not None and e.stream != -1:
                self.on_stream.append(e)
            if e.cat in DEVICE_CATS:
                self.device.append(e)
            elif e.cat in HOST_CATS:
                self.host.append(e)
                if e.correlation is not None:
                    self.launch_ts.setdefault(e.correlation, e.ts)
            elif e.cat in ("user_annotation", "cpu_instant_event", "python_function") or e.cat.startswith("user"):
                m = _STEP.match(e.name)
                if m:
                    self.steps.append((int(m.group(1)), e))
                elif e.cat == "user_annotation":
                    self.annotations.append(e)
        if not self.device:
            raise ValueError(f"{where} has no device events (cat kernel, gpu_memcpy or gpu_memset): a CPU-only "
                             f"profile? Record with torch.profiler's ProfilerActivity.CUDA")
        self.steps.sort(key=lambda s: s[1].ts)
        #: Start of the last ProfilerStep when there are two or more (HTA leaves that step out):
        #: found once, not per event (in_window runs for every device event: many steps made
        #: a summary quadratic).
        self.last_step_start: float | None = self.steps[-1][1].ts if len(self.steps) >= 2 else None

    # -- HTA's window ----------------------------------------------------------------

    def in_window(self, e: Event) -> bool:
        """Device work HTA keeps: launched (or, without a launch, started) before the last step."""
        cut = self.last_step_start
        if cut is None:
            return True
        launch = self.launch_ts.get(e.correlation) if e.correlation is not None else None
        return (launch if launch is not None else e.ts) < cut
