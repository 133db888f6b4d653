"""How an engine is built (``EngineConfig``), and the limits its values are checked against.

Values are checked when the config is created, before any device process starts.  Each limit sits
where a value stops making sense for the toy, or would fail far from its cause (in the allocator,
or after minutes of spinning); the sizes behind them are in docs/measurements/engine.md.
"""

import dataclasses
import os
from dataclasses import dataclass

from .constraint import CONSTRAINTS
from .validate import check_bool, check_choice, check_float, check_int, check_seed

__all__ = ["EngineConfig", "MODES", "DEVICES", "check_kv_cache_size", "plain_config"]

MODES = ("serial", "zos")
DEVICES = ("auto", "cuda", "cpu", "paced")
MAX_SLOTS = 8  # host buffer slots: overlap needs 2; more only cost memory
MAX_TEMPERATURE = 100.0  # far beyond where sampling is already uniform noise
MAX_HOST_OVERHEAD_MS = 1000.0
MAX_DRAFT_TOKENS = 16  # past this, drafts burn device time on tokens that are never accepted
MAX_KV_CACHE_BYTES = 4 * 2**30  # the cache is allocated whole at start: refuse it here, not in the allocator
MAX_BATCH_SIZE = 4096  # every row's metadata is allocated up front, double-buffered on host and device


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
            raise dataclasses.FrozenInstanceError(
                f"EngineConfig is frozen: the engine's buffers, cache and device were built from it. To "
                f"change {name}, make a new engine: Engine(dataclasses.replace(config, {name}={value!r}))")
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
