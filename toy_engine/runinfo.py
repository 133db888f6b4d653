"""What a timeline says about its run: the engine's settings, the workload, the headline
numbers; plain data a stored trace carries as JSON and reads back equal."""

import functools
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass

__all__ = ["RunStats", "TimelineMeta", "Workload", "from_json_object"]


@dataclass(frozen=True)
class Workload:
    """What ``generate`` was asked: how many prompts, how many new tokens each, how hot."""

    requests: int
    max_new_tokens: int
    temperature: float


@dataclass(frozen=True)
class RunStats:
    """A run's headline numbers (``engine.stats``).  Per-round means are over the rounds with spans
    (host time leaves waits out); ``decode_...`` leaves the prefill rounds out."""

    rounds: int
    wall_ms: float  # the loop, start to end
    device_busy_ms: float
    device_idle_fraction: float
    mean_host_ms_per_round: float
    mean_device_ms_per_round: float
    tokens: int
    tokens_per_s: float
    prefill_rounds: int
    decode_rounds: int
    decode_device_idle_fraction: float
    draft_tokens_proposed: int
    draft_tokens_accepted: int
    mean_accepted_per_round: float  # per request and decode round, as speculative-decoding papers count
    tokens_per_forward: float
    discarded_outputs: int  # outputs of requests already finished (the extra round under ZOS)
    launch_latency_ms: float | None = None  # median; None where the device does not measure it


@dataclass
class TimelineMeta:
    """The run a timeline records: settings and workload at its start, rounds and stats at its end."""

    mode: str | None = None  # "serial" or "zos"; "imported" for a profiler's trace
    device: str | None = None
    num_draft_tokens: int = 0
    max_batch_size: int | None = None
    host_overhead_ms: float = 0.0
    workload: Workload | None = None
    pacing: dict | None = None  # a paced stand-in's time model (ms) and why it was chosen; None: not paced
    prefill_rounds: list[int] = field(default_factory=list)
    stats: RunStats | None = None
    annotations: dict = field(default_factory=dict)  # name -> JSON value: the course's, never read here


_KINDS = {type(None): "null", bool: "true or false", int: "an integer", float: "a number", str: "a string",
          dict: "an object", list: "a list"}


def from_json_object(cls, raw, where: str):
    """A ``cls`` from its parsed JSON object, refused with a sentence naming ``where`` and the field
    when one is unknown, missing, or wrong: code reading it would fail later, far from the cause."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object, got {type(raw).__name__}")
    known, required = _fields(cls)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {unknown}; its fields are {list(known)}")
    missing = [name for name in required if name not in raw]
    if missing:
        raise ValueError(f"{where} is missing field(s) {missing}")
    values = {name: _typed(value, *known[name], f"{where}[{name!r}]") for name, value in raw.items()}
    try:
        return cls(**values)
    except ValueError as exc:
        raise ValueError(f"{where} is invalid: {exc}") from None


@functools.cache
def _fields(cls) -> tuple[dict, list]:
    """Per field of ``cls`` its annotation and ``about``; the fields without a default."""
    hints = typing.get_type_hints(cls)
    known = {f.name: (hints[f.name], f.metadata.get("about")) for f in fields(cls)}
    return known, [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def _typed(value, kind, about: str | None, where: str):
    """``value`` if it has type ``kind`` (a dataclass is built); an int is a number, a bool no integer."""
    options = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    for option in options:
        base = typing.get_origin(option) or option
        if is_dataclass(option) and isinstance(value, dict):
            return from_json_object(option, value, where)
        if base is list and isinstance(value, list):
            item = (typing.get_args(option) or (object,))[0]
            return [_typed(v, item, None, f"{where}[{i}]") for i, v in enumerate(value)]
        if base is object or type(value) is base or (base is float and type(value) is int):
            return value
    wanted = " or ".join("an object" if is_dataclass(o) else _KINDS[typing.get_origin(o) or o] for o in options)
    raise ValueError(f"{where} must be {wanted}{f' ({about})' if about else ''}, got {type(value).__name__}")
