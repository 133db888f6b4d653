"""How an engine is built (``EngineConfig``), and the limits its values are checked against.

Values are checked when the config is created, before any device process starts.  Each limit sits
where a value stops making sense for the toy, or would fail far from its cause (in the allocator,
or after minutes of spinning); the sizes behind them are in docs/measurements/engine.md.
"""

import dataclasses
import os
from dataclasses import dataclass

from .constraint import CONSTRAINTS
from .sending import LRU_CACHED
from .validate import _label, check_bool, check_choice, check_float, check_int, check_seed, shown

__all__ = ["EngineConfig", "MODES", "DEVICES", "check_kv_cache_size", "plain_config",
           "replaced_config", "check_correction"]

MODES = ("serial", "zos")
DEVICES = ("auto", "cuda", "cpu", "paced")
MAX_SLOTS = 8  # host buffer slots: overlap needs 2; more only cost memory
MAX_TEMPERATURE = 100.0  # far beyond where sampling is already uniform noise
MAX_HOST_OVERHEAD_MS = 1000.0
MAX_DRAFT_TOKENS = 16  # past this, drafts burn device time on tokens that are never accepted
MAX_KV_CACHE_BYTES = 4 * 2**30  # the cache is allocated whole at start: refuse it here, not in the allocator
MAX_BATCH_SIZE = 4096  # every row's metadata is allocated up front, double-buffered on host and device


#: What a run reads afresh: an engine's config may change these between runs.
PER_RUN = ("mode", "seed", "correct_seqlens", "host_overhead_ms")
#: What an engine was built from, and how: these cannot change once it is built.
BUILT_FROM = dict(device="its device is of that kind",
                  max_batch_size="its buffers and device state have that many rows",
                  num_kv_blocks="its KV cache was allocated with that many blocks",
                  block_size="its KV cache and block tables are laid out in blocks of that size",
                  num_draft_tokens="its buffers and device state hold that many drafts a row",
                  race_check="its device's race checker was set up with it",
                  device_threads="its device process was started with that many threads",
                  constraint="its mask buffers and constraint were built for it")


@dataclass
class EngineConfig:
    """Checked when created, and frozen (buffers and cache are sized from it): use ``dataclasses.replace``."""

    mode: str = "serial"            # "serial" or "zos"
    device: str = "auto"            # "auto" (CUDA, else the CPU stand-in: paced on 1 CPU), "cuda", "cpu", "paced"
    max_batch_size: int = 8
    num_kv_blocks: int = 128
    block_size: int = 16
    seed: int = 0                   # default seed for requests sampled with temperature > 0
    num_draft_tokens: int = 0       # speculative decoding: drafts per decode round (0 = off)
    correct_seqlens: bool = True    # False is a deliberate bug, for teaching: stale lengths
    race_check: bool = True         # the course's compute-sanitizer (cheap; off in benchmarks)
    host_overhead_ms: float = 0.0   # extra, labelled host work per round (teaching knob)
    device_threads: int = 1         # torch threads of the CPU stand-in's device process
    constraint: str | None = None   # "title_case": a sampling mask built from committed text (constraint.py)

    def __post_init__(self) -> None:
        cpus = os.cpu_count() or 1
        values = dict(
            mode=check_choice("mode", self.mode, MODES),  # plain str: what is checked is what runs
            device=check_choice("device", self.device, DEVICES),
            max_batch_size=check_int("max_batch_size", self.max_batch_size, 1, MAX_BATCH_SIZE,
                                     " (metadata is sized per row and allocated up front)"),
            num_kv_blocks=check_int("num_kv_blocks", self.num_kv_blocks, 1),
            block_size=check_int("block_size", self.block_size, 1),
            seed=check_seed("seed", self.seed),
            num_draft_tokens=check_int("num_draft_tokens", self.num_draft_tokens, 0, MAX_DRAFT_TOKENS),
            correct_seqlens=check_bool("correct_seqlens", self.correct_seqlens),
            race_check=check_bool("race_check", self.race_check),
            host_overhead_ms=check_float("host_overhead_ms", self.host_overhead_ms, 0.0, MAX_HOST_OVERHEAD_MS,
                                         " ms"),
            device_threads=check_int("device_threads", self.device_threads, 1, cpus,
                                     f": this machine has {cpus} CPUs, and more threads than CPUs "
                                     f"only wait for each other"),
        )
        if self.constraint is not None:
            constraint = check_choice("constraint", self.constraint, CONSTRAINTS)
            values["constraint"] = constraint
            if values["num_draft_tokens"]:
                raise ValueError(f"constraint={constraint!r} needs num_draft_tokens=0 (got "
                                 f"{self.num_draft_tokens}): a draft position's mask depends on the drafts "
                                 f"before it, which only the device knows; use one or the other")
        for name, value in values.items():  # plain values from here on (numpy ints accepted)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value) -> None:
        if getattr(self, "_frozen", False):
            new = f"dataclasses.replace(config, {name}={value!r})"
            how = (f"a new engine, Engine({new}); or, between runs, set engine.config = "
                   f"{new.replace('(config', '(engine.config')} (a run reads {name} afresh)"
                   if name in PER_RUN else
                   f"a new engine: Engine({new}) (the engine was built from it)")
            raise dataclasses.FrozenInstanceError(f"EngineConfig is frozen: engines read it as "
                                                  f"it is. To change {name}, make {how}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name) -> None:
        raise dataclasses.FrozenInstanceError(f"EngineConfig is frozen: cannot delete {name}")


def plain_config(config: EngineConfig) -> EngineConfig:
    """``config``, or for a subclass a plain EngineConfig of the values it stored, checked again: a
    subclass's own attribute lookup may give other values than the ones its checks passed."""
    if type(config) is EngineConfig:
        return config
    values = {}
    for f in dataclasses.fields(EngineConfig):
        try:
            values[f.name] = object.__getattribute__(config, f.name)
        except AttributeError:
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__} without "
                            f"the field {f.name}: build te.EngineConfig(...)") from None
    return EngineConfig(**values)


def check_kv_cache_size(config: EngineConfig, model) -> None:
    """Refuse a cache above MAX_KV_CACHE_BYTES for ``model``, naming the largest that fits."""
    cfg = model.cfg
    slots = config.num_kv_blocks * config.block_size
    per_slot = cfg.n_layer * 2 * cfg.n_embd * model.tok_emb.weight.element_size()
    if slots * per_slot > MAX_KV_CACHE_BYTES:
        fit = MAX_KV_CACHE_BYTES // (per_slot * config.block_size)
        raise ValueError(f"num_kv_blocks x block_size = {config.num_kv_blocks} x {config.block_size} = {slots} "
                         f"token slots would need a KV cache of {slots * per_slot / 2**30:.1f} GiB ({per_slot} "
                         f"bytes per slot for this model), above the {MAX_KV_CACHE_BYTES / 2**30:.0f} GiB limit: "
                         f"use at most {fit} blocks of {config.block_size}")


def replaced_config(built: EngineConfig, now) -> EngineConfig:
    """``now``, put in ``engine.config`` between runs, as a plain config; refused if it changes
    what the engine was built from (BUILT_FROM), which would no longer match it."""
    if not isinstance(now, EngineConfig):
        raise TypeError(f"engine.config must stay the EngineConfig the engine was built with, "
                        f"got {type(now).__name__} {shown(now)}: build a new te.Engine")
    now = plain_config(now)
    changed = [name for name in BUILT_FROM if getattr(now, name) != getattr(built, name)]
    if changed:
        new = ", ".join(f"{name}={shown(getattr(now, name))}" for name in changed)
        old = ", ".join(f"{name}={shown(getattr(built, name))}" for name in changed)
        why = "; ".join(f"{name}: {BUILT_FROM[name]}" for name in changed)
        raise ValueError(f"engine.config was replaced after the engine was built ({new}), "
                         f"but the engine was built from those values ({why}): build a new "
                         f"engine from it (engine.close(); engine = te.Engine(engine.config)) "
                         f"or put the values back: engine.config = dataclasses.replace("
                         f"engine.config, {old})")
    return built if now == built else now


def check_correction(correction, config: EngineConfig, loop) -> None:
    """Refuse a ``correction`` that runs of ``config`` with ``loop`` (None: the mode's) never
    call: dropped, a broken one would seem to work."""
    fix = "engine.config = dataclasses.replace(engine.config, "
    why = ("this engine has no drafts (num_draft_tokens=0), and only accepted drafts make the "
           "lengths stale: build one with num_draft_tokens > 0" if not config.num_draft_tokens
           else "correct_seqlens=False turns the correction off (the deliberate bug): set "
           f"{fix}correct_seqlens=True)" if not config.correct_seqlens
           else "the serial loop (mode='serial') processes each round before preparing the "
           f"next, so no length is stale: set {fix}mode='zos') or give a loop that calls "
           "engine.correct_on_device" if loop is None and config.mode == "serial" else None)
    if why is not None:
        raise ValueError(f"correction={_label(correction)} would never be called: {why}")
    if type(correction) is LRU_CACHED:  # round 38: failed on the device
        raise TypeError(f"correction={_label(correction.__wrapped__)} is cached "
                        f"(functools.cache or lru_cache), but the run calls it with the round's "
                        f"metadata, a dict, which cannot be a cache key: remove the decorator")
