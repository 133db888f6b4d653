"""Requests and their results, as the host's request layer sees them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Completion:
    """What ``Engine.generate`` returns for one prompt."""

    request_id: int
    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str  # "length" | "stop" | "eos" | "abort"


@dataclass
class Request:
    """One prompt's life in the engine.

    Two lengths matter, and under ZOS they differ:

    * ``output_ids`` -- tokens *committed*: processed by the host, visible to the user;
    * ``num_inflight`` -- rounds launched for this request whose results the host has
      not processed yet.  The host plans the next round as if each of them adds exactly
      one token; the device corrects that guess when a round accepted drafts.
    """

    id: int
    index: int  # position in the generate call's prompt list (messages name prompts by it)
    prompt: str
    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int = 0
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
    def planned_len(self) -> int:
        """Tokens the host believes the sequence will have once in-flight rounds land."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_inflight

    def wants_more(self) -> bool:
        """Whether another decode round can still produce a token the user will see."""
        return not self.finished and len(self.output_ids) + self.num_inflight < self.max_new_tokens

    def commit(self, token_ids, eos_id: int, decode) -> None:
        """Append sampled tokens one by one, stopping exactly at EOS, a stop string or
        the length limit; nothing after the stop is ever kept."""
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

    def completion(self) -> Completion:
        return Completion(self.id, self.prompt, self.text, list(self.output_ids), self.finish_reason or "abort")
