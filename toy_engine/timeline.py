"""A recorded timeline of one engine run.

The course's question is "how much of the time is the device waiting for the
host?".  To answer it we record *spans*: intervals on two lanes, ``host`` (the
Python scheduler loop) and ``device`` (the CUDA stream, or the CPU stand-in
process), all on one shared clock.  Idle gaps on the device lane are the
overhead that asynchronous ("zero-overhead") scheduling tries to hide.

Design notes
------------
* Times are stored as float milliseconds relative to ``Timeline.origin_ns``
  (a ``time.perf_counter_ns()`` value).  Small relative numbers are easy to
  read and plot; ``perf_counter_ns`` is a monotonic clock shared by all
  processes on Linux (CLOCK_MONOTONIC), so a device process can stamp its own
  work in ns and we convert it with :meth:`Timeline.add_device_ns`.
* A span's ``round`` is the engine round whose work it is, not the round during
  which it ran: with overlap, round N-1's postprocess runs while round N is on
  the device, and keeping the owner's round makes that visible.
* Everything is plain Python + stdlib so the timeline can be saved as JSON from
  the engine and reloaded in a notebook without torch.
* Appending to ``spans`` is a single ``list.append`` (atomic under the GIL), so
  a recorder thread and the main loop may both add spans; no locking is done.
* A span may carry ``cpu_ms``: the CPU time its process (device) or thread (host)
  really got during it.  On the CPU stand-in the device is a process that needs a
  core; when other work takes that core, a 3 ms forward can take 6 ms of wall time
  with 3 ms of CPU.  ``wall >> CPU`` is how a figure tells "the machine was busy"
  from "the device was idle" or "the kernel is slow" (the course's contention meter).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Iterator

__all__ = ["Span", "Timeline", "LANES", "HOST_STAGES", "DEVICE_STAGES", "PROCESS_STAGES"]

LANES = ("host", "device")
#: The stage names the engine records (documentation only; any non-empty string is accepted).
HOST_STAGES = ("schedule", "prepare", "launch_forward", "launch_sample", "wait", "postprocess", "flush",
               "overhead")
DEVICE_STAGES = ("upload", "correct", "forward", "sample")

#: Host stages that consume a round's results (they wait for its sample event first).
PROCESS_STAGES = ("postprocess", "flush")

_VERSION = 1
_SPAN_FIELDS = ("lane", "stage", "round", "start_ms", "end_ms")
# The meta fields that code reads (summary, contention, the figures, the bench): their types.
_META_TYPES = {"machine_load": dict, "recorded": dict, "stats": dict, "prefill_rounds": list, "mode": str,
               "device": str, "host_overhead_ms": (int, float)}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked_meta(meta) -> dict:
    """A copy of ``meta``, refused with a sentence where a field that code reads has the
    wrong type (it would raise AttributeError or TypeError later, far from the cause)."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise TypeError(f"Timeline meta must be a dict, got {type(meta).__name__}")
    for key, kind in _META_TYPES.items():
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            what = {dict: "an object", list: "a list", str: "a string"}.get(kind, "a number")
            raise ValueError(f"timeline meta[{key!r}] must be {what}, got {type(meta[key]).__name__}")
    others = meta.get("machine_load", {}).get("others_cpus")
    if others is not None and not _is_number(others):
        raise ValueError(f"timeline meta['machine_load']['others_cpus'] must be a number or null, got "
                         f"{type(others).__name__}")
    if not all(type(r) is int for r in meta.get("prefill_rounds", ())):  # noqa: E721 - bools are not rounds
        raise ValueError("timeline meta['prefill_rounds'] must be a list of round numbers")
    if not all(_is_number(v) or v is None for v in meta.get("stats", {}).values()):
        raise ValueError("timeline meta['stats'] values must be numbers")
    if not isinstance(meta.get("recorded", {}).get("machine", {}), dict):
        raise ValueError("timeline meta['recorded']['machine'] must be an object")
    return dict(meta)


@dataclass(frozen=True)
class Span:
    """One interval of work on one lane.

    ``start_ms``/``end_ms`` are ms on the shared clock, relative to the owning
    timeline's ``origin_ns``.  They are stored as floats so that a span written
    to JSON and read back compares equal.
    """

    lane: str
    stage: str
    round: int
    start_ms: float
    end_ms: float
    owner: str = ""
    cpu_ms: float | None = None  # CPU time the work got (None: not measured, e.g. CUDA)

    def __post_init__(self) -> None:
        if self.lane not in LANES:
            raise ValueError(f"Span lane must be 'host' or 'device', got {self.lane!r}")
        if not isinstance(self.stage, str) or not self.stage:
            raise ValueError(f"Span stage must be a non-empty string, got {self.stage!r}")
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise ValueError(
                f"Span round must be an int >= 0, got {self.round!r} (stage {self.stage!r})"
            )
        if not isinstance(self.owner, str):
            raise ValueError(f"Span owner must be a string, got {self.owner!r}")
        for name in ("start_ms", "end_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(
                    f"Span {name} must be a finite number, got {value!r} "
                    f"(stage {self.stage!r}, round {self.round})"
                )
            # Normalise ints to float so equality survives a JSON round trip.
            object.__setattr__(self, name, float(value))
        if self.cpu_ms is not None:
            if (isinstance(self.cpu_ms, bool) or not isinstance(self.cpu_ms, (int, float))
                    or not math.isfinite(self.cpu_ms) or self.cpu_ms < 0):
                raise ValueError(f"Span cpu_ms must be None or a finite number >= 0, got {self.cpu_ms!r} "
                                 f"(stage {self.stage!r}, round {self.round})")
            object.__setattr__(self, "cpu_ms", float(self.cpu_ms))
        if self.end_ms < self.start_ms:
            raise ValueError(
                f"Span {self.stage!r} of round {self.round} ends before it starts: "
                f"start_ms={self.start_ms!r}, end_ms={self.end_ms!r}"
            )

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms

    @property
    def cpu_share(self) -> float | None:
        """CPU time / wall time (None when not measured or the span is empty)."""
        if self.cpu_ms is None or self.duration_ms <= 0:
            return None
        return min(1.0, self.cpu_ms / self.duration_ms)


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals as sorted, disjoint intervals (touching ones are joined).

    Merging first is what makes "busy" mean "the device was doing something":
    a ``forward`` and an overlapping ``draft`` must not be counted twice, and
    the gap between back-to-back spans is zero, not a gap.
    """
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _union_ms(spans: Iterable[Span]) -> float:
    return sum(e - s for s, e in _merge((sp.start_ms, sp.end_ms) for sp in spans))


class Timeline:
    """Spans of one engine run, plus free-form ``meta`` (mode, device, ...)."""

    def __init__(self, origin_ns: int | None = None, meta: dict | None = None) -> None:
        self.origin_ns: int = time.perf_counter_ns() if origin_ns is None else int(origin_ns)
        self.spans: list[Span] = []
        self.meta: dict = _checked_meta(meta)

    # -- clock ---------------------------------------------------------------

    def ns_to_ms(self, t_ns: int) -> float:
        """Convert a ``perf_counter_ns`` stamp to ms relative to ``origin_ns``."""
        # Subtract as ints first: exact, and keeps the float small and precise.
        return (t_ns - self.origin_ns) / 1e6

    def now_ms(self) -> float:
        return self.ns_to_ms(time.perf_counter_ns())

    # -- recording -----------------------------------------------------------

    def add(self, lane: str, stage: str, round: int, start_ms: float, end_ms: float,
            owner: str = "", cpu_ms: float | None = None) -> Span:
        span = Span(lane, stage, round, start_ms, end_ms, owner, cpu_ms)
        self.spans.append(span)
        return span

    @contextmanager
    def host_span(self, stage: str, round: int, owner: str = "") -> Iterator[None]:
        """Record a host span around the ``with`` block, with the host thread's CPU time.

        The span is recorded even if the block raises: time spent before an
        error is still time the device may have been waiting.  ``thread_time``
        (not ``process_time``): a notebook kernel's other threads are not the loop.
        """
        start, cpu_start = self.now_ms(), time.thread_time_ns()
        try:
            yield
        finally:
            cpu = (time.thread_time_ns() - cpu_start) / 1e6
            self.add("host", stage, round, start, self.now_ms(), owner, cpu)

    def add_device_ns(self, stage: str, round: int, start_ns: int, end_ns: int,
                      owner: str = "", cpu_ns: int | None = None) -> Span:
        """Add a device span stamped in ``perf_counter_ns`` (same clock as the host),
        with the CPU time the device process got during it, if measured."""
        return self.add("device", stage, round, self.ns_to_ms(start_ns),
                        self.ns_to_ms(end_ns), owner, None if cpu_ns is None else cpu_ns / 1e6)

    # -- queries -------------------------------------------------------------

    def lane(self, lane: str) -> list[Span]:
        """Spans of one lane, sorted by start (then end)."""
        if lane not in LANES:
            raise ValueError(f"lane must be 'host' or 'device', got {lane!r}")
        return sorted((s for s in self.spans if s.lane == lane),
                      key=lambda s: (s.start_ms, s.end_ms))

    def rounds(self) -> list[int]:
        """Distinct rounds that have at least one span, ascending."""
        return sorted({s.round for s in self.spans})

    def _device(self, rounds: Iterable[int] | None = None) -> list[Span]:
        spans = self.lane("device")
        if rounds is not None:
            wanted = set(rounds)
            spans = [s for s in spans if s.round in wanted]
        return spans

    def device_gaps(self, start_ms: float | None = None,
                    end_ms: float | None = None) -> list[tuple[float, float]]:
        """Idle intervals between consecutive (merged) device spans.

        Only gaps strictly between device work count: time before the first or
        after the last device span is start-up/tear-down, not overhead.  With
        ``start_ms``/``end_ms`` the gaps are additionally clipped to that window.
        """
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
        return _union_ms(self._device(rounds))

    def device_idle_fraction(self, rounds: Iterable[int] | None = None) -> float:
        """Share of the device's time spent waiting: idle / (idle + busy).

        Without ``rounds`` this is 1 - busy / window over the whole run.  With
        ``rounds`` each idle gap is charged to the round whose work ends it (the
        device was waiting *for that round*), so e.g. the decode rounds' idle
        fraction is not polluted by prefill rounds in between.  0.0 when there
        are no device spans.
        """
        wanted = None if rounds is None else set(rounds)
        idle, reached = 0.0, None  # reached: end of all device work seen so far
        for span in self.lane("device"):
            if reached is not None and span.start_ms > reached and (wanted is None or span.round in wanted):
                idle += span.start_ms - reached
            reached = span.end_ms if reached is None else max(reached, span.end_ms)
        busy = self.device_busy_ms(rounds)
        return idle / (idle + busy) if idle + busy > 0 else 0.0

    def summary(self) -> dict:
        """Headline numbers for one run.

        ``mean_host_ms_per_round`` is the union of host spans of each round
        excluding ``wait`` (waiting for the device is not host *work*);
        ``mean_device_ms_per_round`` the union of that round's device spans.
        Both are averaged over all rounds in :meth:`rounds` (a round with no
        span on a lane contributes 0).  ``wall_ms`` runs from the earliest
        start to the latest end over both lanes.
        """
        rounds = self.rounds()
        n = len(rounds)
        host_total = sum(
            _union_ms(s for s in self.spans
                      if s.lane == "host" and s.round == r and s.stage != "wait")
            for r in rounds)
        device_total = sum(
            _union_ms(s for s in self.spans if s.lane == "device" and s.round == r)
            for r in rounds)
        wall = (max(s.end_ms for s in self.spans) - min(s.start_ms for s in self.spans)
                if self.spans else 0.0)
        return {
            "rounds": n,
            "wall_ms": wall,
            "device_busy_ms": self.device_busy_ms(),
            "device_idle_fraction": self.device_idle_fraction(),
            "mean_host_ms_per_round": host_total / n if n else 0.0,
            "mean_device_ms_per_round": device_total / n if n else 0.0,
        }

    # -- aligned windows -----------------------------------------------------

    def round_window(self, first_round: int, last_round: int) -> tuple[float, float]:
        """Time range of rounds ``first_round..last_round`` that is comparable across runs.

        From the moment round ``first_round - 1``'s tokens reached the requests (the end of
        its ``postprocess``) to the moment round ``last_round``'s did: the time the engine
        took to deliver these rounds, which is what throughput is made of, in any loop.
        Serial and ZOS deliver one round per pass, so equal widths mean equal time and the
        run with more tokens per second draws the shorter window.  Two other choices did
        not: starting at the window's first span charged ZOS a forward of the round before
        (its schedule runs under that forward); starting at the first round's device work
        but ending at its processing charged ZOS its one-round deferral, so on the recorded
        2 ms traces ZOS, 7 % faster, drew the longer window in 12 of 21 three-round windows
        (delivery to delivery: in 2, each within its own slower device time).  Where round
        ``first_round - 1`` was never processed (the run's first round) the window starts at
        its first device work; rounds without processing end at their last device work.
        """
        if last_round < first_round:
            raise ValueError(f"last_round ({last_round}) must be >= first_round ({first_round})")
        spans = [s for s in self.spans if first_round <= s.round <= last_round]
        if not spans:
            rounds = self.rounds()
            raise ValueError(f"rounds {first_round}..{last_round} have no spans in this timeline "
                             f"(it has rounds {rounds[0] if rounds else None}..{rounds[-1] if rounds else None})")
        delivered = [s.end_ms for s in self.spans
                     if s.round == first_round - 1 and s.lane == "host" and s.stage in PROCESS_STAGES]
        starts = [s.start_ms for s in spans if s.lane == "device"] or [s.start_ms for s in spans]
        ends = ([s.end_ms for s in spans if s.lane == "host" and s.stage in PROCESS_STAGES]
                or [s.end_ms for s in spans if s.lane == "device"] or [s.end_ms for s in spans])
        t0, t1 = (max(delivered) if delivered else min(starts)), max(ends)
        return t0, max(t0, t1)

    # -- persistence ---------------------------------------------------------

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise to JSON text (and write it to ``path`` if given).

        Python's ``json`` writes floats with ``repr``, which round-trips
        exactly, so spans read back compare equal.
        """
        text = json.dumps({
            "version": _VERSION,
            "origin_ns": self.origin_ns,
            "meta": self.meta,
            "spans": [asdict(s) for s in self.spans],
        })
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | bytes | Path) -> "Timeline":
        """Load from JSON text (``str`` or ``bytes``) or a file path (``str`` or ``Path``).

        A ``str`` whose first non-blank character (after an optional byte-order mark) is
        ``{`` or ``[`` is JSON text, any other non-empty ``str`` a path.  Malformed input
        raises ``ValueError`` saying which of the two it tried to read and what is wrong.
        """
        if isinstance(text_or_path, (bytes, bytearray)):
            try:
                text, source = bytes(text_or_path).decode("utf-8-sig"), "timeline JSON bytes"
            except UnicodeDecodeError as exc:
                raise ValueError(f"timeline JSON bytes are not UTF-8: {exc}") from None
        elif isinstance(text_or_path, str) and text_or_path.lstrip("\ufeff \t\r\n").startswith(("{", "[")):
            text, source = text_or_path.lstrip("\ufeff"), "timeline JSON text"
        elif isinstance(text_or_path, (str, Path)):
            if not str(text_or_path).strip():
                raise ValueError("Timeline.from_json got an empty string: pass JSON text or a file path")
            try:
                text = Path(text_or_path).read_text(encoding="utf-8-sig")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read timeline file {str(text_or_path)!r} (a str is read as a path "
                                 f"unless it starts with '{{'): {exc}") from exc
            source = f"timeline file {str(text_or_path)!r}"
        else:
            raise TypeError(f"Timeline.from_json takes JSON text (str/bytes) or a path (str/Path), got "
                            f"{type(text_or_path).__name__}")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not valid JSON: {exc}") from exc
        except RecursionError:
            raise ValueError(f"{source} is nested too deeply to be a timeline") from None
        if not isinstance(data, dict):
            raise ValueError(f"{source} must be an object, got {type(data).__name__}")
        for key in ("version", "origin_ns", "meta", "spans"):
            if key not in data:
                raise ValueError(f"{source} is missing field {key!r}")
        version = data["version"]
        if type(version) is not int or version != _VERSION:  # noqa: E721 - True == 1 must not pass
            raise ValueError(f"unsupported timeline version {version!r} in {source} (expected {_VERSION})")
        origin = data["origin_ns"]
        if isinstance(origin, bool) or not isinstance(origin, int):
            raise ValueError(f"timeline origin_ns must be an int, got {origin!r}")
        if not isinstance(data["meta"], dict):
            raise ValueError("timeline meta must be an object")
        if not isinstance(data["spans"], list):
            raise ValueError("timeline spans must be a list")
        known = {f.name for f in fields(Span)}
        try:
            tl = cls(origin_ns=origin, meta=data["meta"])
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
        for i, raw in enumerate(data["spans"]):
            if not isinstance(raw, dict):
                raise ValueError(f"span {i} must be an object, got {raw!r}")
            missing = [k for k in _SPAN_FIELDS if k not in raw]
            if missing:
                raise ValueError(f"span {i} is missing field(s) {missing}")
            unknown = sorted(set(raw) - known)
            if unknown:
                raise ValueError(f"span {i} has unknown field(s) {unknown}; a span has {sorted(known)}")
            try:
                tl.spans.append(Span(**raw))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"span {i} is invalid: {exc}") from exc
        return tl

    # -- dunder --------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        return (f"Timeline(spans={len(self.spans)}, rounds={len(self.rounds())}, "
                f"origin_ns={self.origin_ns}, meta={self.meta!r})")
