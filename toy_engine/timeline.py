"""A recorded timeline of one engine run: spans of work on a host lane and a device lane (and ``run_stats``).

The device lane's idle gaps are the overhead overlapped scheduling hides.  Times: ms since ``origin_ns``
(``perf_counter_ns``).  Plain Python: reloads without torch; a span is one (atomic) append, no lock.
"""

import json
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Iterable, Iterator

from .runinfo import RunStats, TimelineMeta, from_json_object
from .validate import shown

__all__ = ["Span", "Stage", "Timeline", "TimelineMeta", "owner_name", "run_stats", "LANES", "HOST_STAGES",
           "DEVICE_STAGES", "PROCESS_STAGES"]

LANES = ("host", "device")


class Stage(StrEnum):
    """The stages the engine records; a member equals its string (JSON, ``span.stage == "forward"``)."""

    SCHEDULE = "schedule"
    OVERHEAD = "overhead"  # deliberate extra host work (EngineConfig.host_overhead_ms)
    PREPARE = "prepare"
    LAUNCH_FORWARD = "launch_forward"
    LAUNCH_SAMPLE = "launch_sample"
    WAIT = "wait"
    POSTPROCESS = "postprocess"
    FLUSH = "flush"  # a postprocess with no next round left to hide it under
    SETUP = "setup"  # the device's start-up, part of no run
    UPLOAD = "upload"
    CORRECT = "correct"
    FORWARD = "forward"
    SAMPLE = "sample"


HOST_STAGES = (Stage.SCHEDULE, Stage.PREPARE, Stage.LAUNCH_FORWARD, Stage.LAUNCH_SAMPLE, Stage.WAIT,
               Stage.POSTPROCESS, Stage.FLUSH, Stage.OVERHEAD)
DEVICE_STAGES = (Stage.UPLOAD, Stage.CORRECT, Stage.FORWARD, Stage.SAMPLE)
#: Host stages that consume a round's results (they wait for its sample event first).
PROCESS_STAGES = (Stage.POSTPROCESS, Stage.FLUSH)
_STAGES = {stage.value: stage for stage in Stage}


def processing(stage) -> str:
    """The stage a message names for ``engine.process_outputs`` called with the span label
    ``stage``, which must be postprocess or flush (round 35: any string was taken, and a
    checker then read the span as another stage)."""
    if type(stage) not in (str, Stage) or stage not in PROCESS_STAGES:
        raise ValueError(f"process_outputs was given stage={shown(stage)}: its spans are "
                         f"'postprocess' (the default) or 'flush' (engine.flush's); leave it out")
    return "flush" if stage == Stage.FLUSH else "process_outputs"
_VERSION = 1


def _is_finite_number(value) -> bool:
    """An int or float a float can hold: not a bool, NaN, infinity or an int beyond 1.8e308."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # math.isfinite converts an int to a float first
        return False


def owner_name(owner: int | None) -> str:
    """An owner as a learner reads it: the launched round's ``StepState``, or "" for none."""
    return "" if owner is None else f"StepState(round={owner})"


@dataclass(frozen=True)
class Span:
    """One interval of work on one lane; ``round`` is the round whose work it is, not the one it ran in."""

    lane: str
    stage: str  # a Stage for the engine's work; any other name for imported work ("kernel", a call)
    round: int
    start_ms: float
    end_ms: float
    owner: int | None = field(default=None, metadata={"about": "the round that owns the results; text goes in label"})
    cpu_ms: float | None = None  # CPU time the work got (None: not measured): wall >> CPU means a busy machine
    label: str = ""  # what an imported span was (a call's name, "stream 7: kernel")
    paced_ms: float | None = None  # the paced stand-in's time model for it: it ends no earlier (None: not paced)

    def __post_init__(self) -> None:
        if self.lane not in LANES:
            raise ValueError(f"Span lane must be 'host' or 'device', got {self.lane!r}")
        if not isinstance(self.stage, str) or not self.stage:
            raise ValueError(f"Span stage must be a non-empty string, got {self.stage!r}")
        object.__setattr__(self, "stage", _STAGES.get(self.stage, self.stage))
        where = f"stage {str(self.stage)!r}"
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise ValueError(f"Span round must be an int >= 0, got {self.round!r} ({where})")
        if self.owner is not None and (type(self.owner) is not int or self.owner < 0):  # noqa: E721 - not a bool
            raise ValueError(f"Span owner must be the number of the round that owns the results (an int >= 0) "
                             f"or None, got {self.owner!r} ({where}); a name or other text goes in label")
        if not isinstance(self.label, str):
            raise ValueError(f"Span label must be a string, got {self.label!r} ({where})")
        where += f", round {self.round}"
        for name, optional in (("start_ms", False), ("end_ms", False), ("cpu_ms", True), ("paced_ms", True)):
            value = getattr(self, name)
            if optional and value is None:
                continue
            if not _is_finite_number(value) or (optional and value < 0):
                kind = "None or a finite number >= 0" if optional else "a finite number"
                raise ValueError(f"Span {name} must be {kind}, got {shown(value)} ({where})")
            object.__setattr__(self, name, float(value))  # an int becomes a float: equal after a JSON round trip
        if self.end_ms < self.start_ms:
            raise ValueError(f"Span {str(self.stage)!r} of round {self.round} ends before it starts: "
                             f"start_ms={self.start_ms!r}, end_ms={self.end_ms!r}")

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals as sorted, disjoint intervals: overlaps count once, back-to-back leaves no gap."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def union_ms(spans: Iterable[Span]) -> float:
    return sum(e - s for s, e in _merge((sp.start_ms, sp.end_ms) for sp in spans))


class Timeline:
    """Spans of one engine run, and what run it was (``meta``)."""

    def __init__(self, origin_ns: int | None = None, meta: TimelineMeta | None = None) -> None:
        if meta is not None and not isinstance(meta, TimelineMeta):
            raise TypeError(f"Timeline meta must be a TimelineMeta, got {type(meta).__name__}")
        self.origin_ns: int = time.perf_counter_ns() if origin_ns is None else int(origin_ns)
        self.spans: list[Span] = []
        self.meta = TimelineMeta() if meta is None else meta

    def ns_to_ms(self, t_ns: int) -> float:
        """A ``perf_counter_ns`` stamp as ms since ``origin_ns`` (subtracted as ints: exact)."""
        return (t_ns - self.origin_ns) / 1e6

    def now_ms(self) -> float:
        return self.ns_to_ms(time.perf_counter_ns())

    def add(self, lane: str, stage: str, round: int, start_ms: float, end_ms: float, owner: int | None = None,
            cpu_ms: float | None = None, label: str = "", paced_ms: float | None = None) -> Span:
        span = Span(lane, stage, round, start_ms, end_ms, owner, cpu_ms, label, paced_ms)
        self.spans.append(span)
        return span

    @contextmanager
    def host_span(self, stage: str, round: int, owner: int | None = None) -> Iterator[None]:
        """A host span around the ``with`` block with the thread's CPU time, recorded even if it raises."""
        start, cpu_start = self.now_ms(), time.thread_time_ns()
        try:
            yield
        finally:
            cpu = (time.thread_time_ns() - cpu_start) / 1e6
            self.add("host", stage, round, start, self.now_ms(), owner, cpu)

    def add_device_ns(self, stage: str, round: int, start_ns: int, end_ns: int,
                      owner: int | None = None, cpu_ns: int | None = None, paced_ns: int | None = None) -> Span:
        """A device span stamped in ``perf_counter_ns``, with the CPU time it got and its paced time, if any."""
        return self.add("device", stage, round, self.ns_to_ms(start_ns), self.ns_to_ms(end_ns), owner,
                        None if cpu_ns is None else cpu_ns / 1e6, paced_ms=None if paced_ns is None else paced_ns / 1e6)

    def lane(self, lane: str) -> list[Span]:
        """Spans of one lane, sorted by start (then end)."""
        if lane not in LANES:
            raise ValueError(f"lane must be 'host' or 'device', got {lane!r}")
        return sorted((s for s in self.spans if s.lane == lane), key=lambda s: (s.start_ms, s.end_ms))

    def rounds(self) -> list[int]:
        """Distinct rounds that have at least one span, ascending."""
        return sorted({s.round for s in self.spans})

    def _device(self, rounds: Iterable[int] | None = None) -> list[Span]:
        wanted = None if rounds is None else set(rounds)
        return [s for s in self.lane("device") if wanted is None or s.round in wanted]

    def device_gaps(self, start_ms: float | None = None, end_ms: float | None = None) -> list[tuple[float, float]]:
        """Idle intervals between (merged) device spans, clipped to ``start_ms``..``end_ms``."""
        merged = _merge((s.start_ms, s.end_ms) for s in self._device())
        lo = -math.inf if start_ms is None else start_ms
        hi = math.inf if end_ms is None else end_ms
        gaps = []
        for (_, prev_end), (next_start, _) in zip(merged, merged[1:]):
            g0, g1 = max(prev_end, lo), min(next_start, hi)
            if g1 > g0:
                gaps.append((g0, g1))
        return gaps

    def device_busy_ms(self, rounds: Iterable[int] | None = None) -> float:
        """Length of the union of device spans (optionally only of ``rounds``)."""
        return union_ms(self._device(rounds))

    def device_idle_fraction(self, rounds: Iterable[int] | None = None) -> float:
        """idle / (idle + busy); with ``rounds`` a gap counts for the round whose work ends it."""
        wanted = None if rounds is None else set(rounds)
        idle, reached = 0.0, None  # reached: end of all device work seen so far
        for span in self.lane("device"):
            if reached is not None and span.start_ms > reached and (wanted is None or span.round in wanted):
                idle += span.start_ms - reached
            reached = span.end_ms if reached is None else max(reached, span.end_ms)
        busy = self.device_busy_ms(rounds)
        return idle / (idle + busy) if idle + busy > 0 else 0.0

    def to_json(self, path: str | Path | None = None) -> str:
        """JSON text (also written to ``path``); floats as ``repr``: they read back equal."""
        text = json.dumps(asdict(_Stored(_VERSION, self.origin_ns, self.meta, self.spans)))
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | bytes | Path) -> "Timeline":
        """From JSON text (``str``/``bytes``) or a file (``str``/``Path``; a ``str`` starting with ``{``
        or ``[`` is text); malformed input raises ``ValueError`` saying what it read and what is wrong."""
        text, source = _json_text(text_or_path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not valid JSON: {exc}") from exc
        except RecursionError:
            raise ValueError(f"{source} is nested too deeply to be a timeline") from None
        version = data.get("version", _VERSION) if isinstance(data, dict) else _VERSION
        if type(version) is not int or version != _VERSION:  # noqa: E721 - True == 1 must not pass
            raise ValueError(f"unsupported timeline version {version!r} in {source} (expected {_VERSION})")
        stored = from_json_object(_Stored, data, source)
        tl = cls(origin_ns=stored.origin_ns, meta=stored.meta)
        tl.spans.extend(stored.spans)
        return tl

    def __len__(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        return (f"Timeline(spans={len(self.spans)}, rounds={len(self.rounds())}, "
                f"origin_ns={self.origin_ns}, meta={self.meta!r})")


def run_stats(timeline: Timeline, counts: dict, prefill_rounds: set, wall_s: float,
              launch_latencies_ms: list[float]) -> RunStats:
    """From the run's per-request tallies (``counts``) and which rounds were prefills; linear in
    the spans (Ctrl-C is held meanwhile): 512/1,024/2,048 rounds took 0.07/0.3/1.3 s after the
    loop when each round scanned all spans (10 s at 2,048 on a busy machine), 0.01/0.02/0.05."""
    rounds = timeline.rounds()
    forwards = sorted({s.round for s in timeline.spans if s.stage == Stage.FORWARD})
    decode = [r for r in forwards if r not in prefill_rounds]

    work: dict[tuple[str, int], list[Span]] = {}  # each lane's work by round (waiting is not work)
    for span in timeline.spans:  # grouped once: a scan of all spans per round took rounds^2
        if span.stage != Stage.WAIT:
            work.setdefault((span.lane, span.round), []).append(span)

    def per_round(lane: str) -> float:  # the union of a round's work, averaged
        total = sum(union_ms(work.get((lane, r), ())) for r in rounds)
        return total / len(rounds) if rounds else 0.0

    c = counts
    return RunStats(
        rounds=len(rounds), wall_ms=wall_s * 1e3,
        device_busy_ms=timeline.device_busy_ms(), device_idle_fraction=timeline.device_idle_fraction(),
        mean_host_ms_per_round=per_round("host"), mean_device_ms_per_round=per_round("device"),
        tokens=c["tokens"], tokens_per_s=c["tokens"] / wall_s if wall_s > 0 else 0.0,
        prefill_rounds=len(forwards) - len(decode), decode_rounds=len(decode),
        decode_device_idle_fraction=timeline.device_idle_fraction(decode) if decode else 0.0,
        draft_tokens_proposed=c["proposed"], draft_tokens_accepted=c["accepted"],
        mean_accepted_per_round=c["accepted"] / c["request_decode_rounds"] if c["request_decode_rounds"] else 0.0,
        tokens_per_forward=c["tokens"] / len(forwards) if forwards else 0.0, discarded_outputs=c["discarded"],
        launch_latency_ms=statistics.median(launch_latencies_ms) if launch_latencies_ms else None,
    )


def _json_text(text_or_path) -> tuple[str, str]:
    """The JSON text to parse, and what it came from (for messages)."""
    if isinstance(text_or_path, (bytes, bytearray)):
        try:
            return bytes(text_or_path).decode("utf-8-sig"), "timeline JSON bytes"
        except UnicodeDecodeError as exc:
            raise ValueError(f"timeline JSON bytes are not UTF-8: {exc}") from None
    if isinstance(text_or_path, str) and text_or_path.lstrip("\ufeff \t\r\n").startswith(("{", "[")):
        return text_or_path.lstrip("\ufeff"), "timeline JSON text"
    if not isinstance(text_or_path, (str, Path)):
        raise TypeError(f"Timeline.from_json takes JSON text (str/bytes) or a path (str/Path), got "
                        f"{type(text_or_path).__name__}")
    if not str(text_or_path).strip():
        raise ValueError("Timeline.from_json got an empty string: pass JSON text or a file path")
    try:
        return Path(text_or_path).read_text(encoding="utf-8-sig"), f"timeline file {str(text_or_path)!r}"
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read timeline file {str(text_or_path)!r} (a str is read as a path "
                         f"unless it starts with '{{'): {exc}") from exc


@dataclass
class _Stored:
    """A timeline as its JSON holds it."""

    version: int
    origin_ns: int
    meta: TimelineMeta
    spans: list[Span]
