"""Requests and their results, as the host's request layer sees them, and the checks
that turn a ``generate`` call's arguments into requests."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from .refusals import EndTakenBack
from .validate import SEED_LIMIT, shown

_M64 = 2**64 - 1


@dataclass
class Completion:
    """What ``Engine.generate`` returns for one prompt."""

    request_id: int
    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str  # "length" | "stop" | "eos" | "abort"


#: How a request ends: what Completion.finish_reason says.
FINISH_REASONS = ("length", "stop", "eos", "abort")


class _FinishReason:
    """``req.finish_reason``'s assignments, checked (reads are the request's own, at C speed): a
    reason outside FINISH_REASONS ("stopped", True, "") would be handed out as the request's end,
    and ``finished`` takes anything but None as one.  A request ends once: a reason set back to
    None is refused (its blocks were freed as it ended; a run kept going on it is wrong or never
    ends); one reason for another is a lab's mistake to judge (notebook 07's abort)."""

    def __set__(self, req, value):
        was = vars(req).get("finish_reason")
        if value is None and was is not None:
            raise EndTakenBack(req.index, was)
        if value is not None and not (isinstance(value, str)
                                      and str.__str__(value) in FINISH_REASONS):
            raise (ValueError if isinstance(value, str) else TypeError)(
                f"req.finish_reason = {type(value).__name__} {shown(value)} (prompt {req.index}): "
                f"a request ends with one of {FINISH_REASONS} (the str), or is unfinished (None)")
        vars(req)["finish_reason"] = None if value is None else str.__str__(value)


class _Unreplaceable:
    """A request's method that a plug-in cannot replace on the request: ``completion``, which
    the engine calls as the run ends, where Ctrl-C is held, and hands out what it answers."""

    def __init__(self, method):
        self.method = method

    def __get__(self, req, owner=None):
        return self.method if req is None else self.method.__get__(req, owner)

    def __set__(self, req, value):
        name = self.method.__name__
        raise AttributeError(f"req.{name} cannot be replaced (prompt {req.index}): the engine "
                             f"calls it as the run ends, where Ctrl-C is held, to build what "
                             f"generate returns; during the run change the request's data "
                             f"(output_ids, text, finish_reason), after it the Completions")


@dataclass
class Request:
    """One prompt's life in the engine.  Under ZOS ``output_ids`` (tokens *committed*, visible) and
    ``num_inflight`` (rounds launched, not yet processed) differ; the host plans as if each in-flight
    round adds one token, and the device corrects that guess when a round accepted drafts."""

    id: int
    index: int  # position in the generate call's prompt list (messages name prompts by it)
    prompt: str
    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int = 0  # the call's seed; the request samples from its own stream, see sampling_stream
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    num_inflight: int = 0
    row: int = -1  # row in the device's per-request state, while admitted
    blocks: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def sampling_stream(self) -> int:
        """Key of this request's random stream from the seed and its index (SplitMix64): copies of one
        prompt sample different texts; serial, ZOS and speculative runs draw the same numbers."""
        x = (self.seed + (self.index + 1) * 0x9E3779B97F4A7C15) & _M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        return (x ^ (x >> 31)) % SEED_LIMIT

    @property
    def planned_len(self) -> int:
        """Tokens the host believes the sequence will have once in-flight rounds land."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_inflight

    def wants_more(self) -> bool:
        """Whether another decode round can still produce a token the user will see."""
        return not self.finished and len(self.output_ids) + self.num_inflight < self.max_new_tokens

    def commit(self, token_ids, eos_id: int, decode) -> None:
        """Append sampled tokens, stopping exactly at EOS, a stop string or the length limit."""
        for tok in token_ids:
            if tok == eos_id:
                self.finish_reason = "eos"
                return
            self.output_ids.append(tok)
            self.text += decode([tok])
            for s in self.stop:
                if self.text.endswith(s):
                    self.text = self.text[: -len(s)]
                    del self.output_ids[len(self.output_ids) - len(s):]
                    self.finish_reason = "stop"
                    return
            if len(self.output_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
                return

    @_Unreplaceable
    def completion(self) -> Completion:
        """Called where Ctrl-C is held: only a plain list is copied (a refused object's own
        code, a generator that never ends or an ``__iter__`` that raises, never runs here)."""
        ids = self.output_ids[:] if type(self.output_ids) is list else []
        return Completion(self.id, self.prompt, self.text, ids, self.finish_reason or "abort")


Request.finish_reason = _FinishReason()  # after the dataclass took None as the field's default


MAX_PROMPTS = 100_000  # per call: a queue of requests the toy serves in hours, not a typo's size
MAX_STOPS = 1_000  # stop strings per call: each is compared after every token of every request


def check_prompts(prompts) -> list[str]:
    """A str, or a sequence (list, tuple) of str; anything unordered or not text is refused,
    each item as it is read (a ``range(10**10)`` is refused at its first item, not copied)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    elif isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a str or a list/tuple of str, got {type(prompts).__name__} "
                        f"{shown(prompts)}")
    copied = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            hint = " (decode bytes first: b.decode())" if isinstance(prompt, (bytes, bytearray)) else ""
            raise TypeError(f"prompt {i} must be a str, got {type(prompt).__name__} {shown(prompt)}{hint}")
        prompt = str.__str__(prompt)  # a plain copy: a str subclass's __iter__ or __len__ may lie
        if not prompt:
            raise ValueError(f"prompt {i} is empty: the model needs at least one token")
        if i == MAX_PROMPTS:
            raise ValueError(f"generate() takes at most {MAX_PROMPTS:,} prompts per call: split "
                             f"the list and call it once per part")
        copied.append(prompt)
    if not copied:
        raise ValueError("generate() needs at least one prompt; got an empty list")
    return copied


def check_stop(stop) -> tuple[str, ...]:
    """None, a str, or a sequence of non-empty str, read once into plain str copies (a second
    pass over a changing sequence, or a str subclass's own __len__, would decide what runs)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    elif isinstance(stop, (bytes, bytearray)) or not isinstance(stop, Sequence):
        raise TypeError(f"stop must be None, a str or a list/tuple of str, got {type(stop).__name__} {shown(stop)}")
    copied = []
    for s in stop:
        if len(copied) == MAX_STOPS:  # read one by one: a sequence may never end
            raise ValueError(f"generate() takes at most {MAX_STOPS:,} stop strings per call, got "
                             f"more (or a sequence that never ends): pass a list of the strings")
        if not isinstance(s, str):
            raise TypeError(f"stop strings must be str, got {type(s).__name__} {shown(s)}")
        copied.append(str.__str__(s))
        if not copied[-1]:
            raise ValueError(f"stop strings must be non-empty strings, got {shown(copied)}")
    return tuple(copied)
