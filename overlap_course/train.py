"""Train the shipped TinyGPT checkpoint: ``python -m overlap_course.train``.

The defaults reproduce ``toy_engine/checkpoints/tiny_gpt.pt`` in a few minutes on
two CPU cores.  The choices, briefly:

* **Data.** The synthetic stories of ``overlap_course.corpus`` (seed 0, ~300k chars),
  each followed by EOS; the last 5% of the token stream is held out for validation.
* **Windows of the full context length.** The model has absolute position
  embeddings and the engine serves sequences up to ``context_len`` (256) positions,
  so every position must be trained: we train on windows of ``block_size = 256``.
  Half of the windows start at a story start, so that position 0 holds the first
  character of a story, exactly like a prompt such as "Once" at inference; the other
  half start anywhere, so the model also learns to continue from mid-story text.
* **Optimiser.** AdamW (weight decay on matrices only), linear warmup then cosine
  decay to 10% of the peak learning rate, gradient clipping at 1.0: the standard
  nanoGPT recipe, which is robust at this small scale with a fairly high peak rate.
* **Determinism.** ``torch.manual_seed(seed)`` fixes the initial weights, a private
  ``torch.Generator`` draws the batches, and a fixed ``torch.set_num_threads`` fixes
  how CPU kernels split their reductions: two runs with the same arguments on the
  same machine give bit-identical weights.  Training runs in float32; the engine
  upcasts the checkpoint to float64 on load.
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "train")  # first: Ctrl-C while the imports run is one line

import math
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from overlap_course.command_line import (Parser, fail, finite_number, interrupted, made_folder,
                                         os_problem, out_file, run, whole_number)
from overlap_course.corpus import (corpus_token_stream, generate_corpus, save_whole,
                                   split_train_val)
from toy_engine.data import ALPHABET, CharTokenizer
from toy_engine.model import CHECKPOINT, GPTConfig, TinyGPT
from toy_engine.validate import check_int

VAL_FRACTION = 0.05
#: The most optimizer steps a run may take: days on two CPU cores (the default
#: 800 take minutes).  Past it a run takes weeks, and past ~1e308 the evaluation schedule
#: (a float) overflowed into a traceback.
MAX_STEPS = 1_000_000
#: The most memory one training step may need (:func:`step_bytes`): what a laptop can spare.
#: Batch 256 of full windows fits (it peaked at ~3.6 GB here); 4096 of them, the parser's
#: maximum, needed ~50 GB, and the allocator's failure was a torch traceback.
MAX_STEP_GIB = 4


def load_data(tokenizer: CharTokenizer | None = None):
    """(train, val) int64 token tensors of the default corpus."""
    tokenizer = tokenizer or CharTokenizer()
    stream = torch.tensor(corpus_token_stream(generate_corpus(seed=0), tokenizer))
    return split_train_val(stream, VAL_FRACTION)


def _refuse_unwritable(out: Path) -> None:
    """Make and remove a folder beside ``out``, as saving will (:func:`save_whole`): a folder
    that cannot be written is refused before the training, not after it.  Nothing stays there
    while the training runs, so a run killed then (SIGTERM, SIGHUP) leaves nothing behind."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name[:100]}.", suffix=".partial"))
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(out)) from None


def step_bytes(batch_size: int, block_size: int, cfg: GPTConfig) -> int:
    """About how many bytes a training step holds at its peak (forward and backward), from
    measured peaks (batch 16 to 256, blocks 64 and 256; this estimate is a third above): per
    window and layer, two float32 attention scores per head and pair of positions, and 16 float32
    activations per position and channel."""
    per_layer = 2 * cfg.n_head * block_size**2 + 16 * cfg.n_embd * block_size
    return 4 * batch_size * cfg.n_layer * per_layer


def check_shape(batch_size: int, block_size: int, cfg: GPTConfig) -> None:
    """Refuse, before any work, a window past the model's context and a batch whose step would
    need more than :data:`MAX_STEP_GIB` (an allocation failure deep in torch otherwise)."""
    if not 1 <= block_size <= cfg.context_len:
        raise ValueError(f"block_size must be in 1..{cfg.context_len}, got {block_size}")
    need = step_bytes(batch_size, block_size, cfg)
    if need > MAX_STEP_GIB << 30:
        most = (MAX_STEP_GIB << 30) // step_bytes(1, block_size, cfg)
        raise ValueError(f"--batch-size {batch_size} with --block-size {block_size} needs about "
                         f"{need / 2**30:.1f} GiB for one training step, more than the "
                         f"{MAX_STEP_GIB} GiB a step may take (what a laptop can spare): lower "
                         f"--batch-size to at most {most} (or --block-size)")


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation that failed: torch's CPU allocator raises a plain
    ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory"), CUDA's an OutOfMemoryError."""
    return (isinstance(err, (MemoryError, torch.OutOfMemoryError))
            or "can't allocate memory" in str(err))


def save_checkpoint(model: TinyGPT, alphabet: str, path, **info) -> None:
    """What ``toy_engine.model.load_model`` reads; weights in float32 (half the size: the engine upcasts)."""
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    save_whole({"config": asdict(model.cfg), "alphabet": alphabet, "state_dict": state,
                "info": info}, path)


@torch.no_grad()
def evaluate(model: TinyGPT, tokens: torch.Tensor, block_size: int = 256, max_windows: int = 64) -> float:
    """Mean next-token loss (nats/char) over consecutive non-overlapping windows."""
    n = min(max_windows, (len(tokens) - 1) // block_size)
    x = tokens[: n * block_size].view(n, block_size)
    y = tokens[1 : n * block_size + 1].view(n, block_size)
    was_training = model.training
    model.eval()
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train(was_training)
    return loss


@torch.no_grad()
def sample_text(model: TinyGPT, tokenizer: CharTokenizer, prompt: str, max_new_tokens: int = 250) -> str:
    """Greedy continuation of ``prompt`` with the full forward; stops at EOS."""
    idx = torch.tensor([tokenizer.encode(prompt)])
    out = []
    for _ in range(max_new_tokens):
        logits = model(idx[:, -model.cfg.context_len :])[0, -1]
        nxt = int(logits.argmax())
        if nxt == tokenizer.eos_id:
            break
        out.append(nxt)
        idx = torch.cat([idx, torch.tensor([[nxt]])], dim=1)
    return prompt + tokenizer.decode(out)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``lr / 10``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    steps: int = 800,
    seed: int = 0,
    batch_size: int = 16,
    block_size: int = 256,
    lr: float = 5e-3,
    threads: int = 2,
    out=None,
    progress: bool = True,
    evals: int = 4,
):
    """Train a TinyGPT from scratch; return ``(model, info)`` and save to ``out`` if given,
    whole or not at all (a Ctrl-C or an error leaves the old checkpoint as it was, and removes
    the folders made for it: :class:`made_folder`)."""
    check_shape(batch_size, block_size, GPTConfig(vocab_size=CharTokenizer().vocab_size))
    if out is None:
        return _fit(steps, seed, batch_size, block_size, lr, threads, progress, evals)
    with made_folder(Path(out).parent):
        _refuse_unwritable(Path(out))
        model, info = _fit(steps, seed, batch_size, block_size, lr, threads, progress, evals)
        save_checkpoint(model, ALPHABET, out, **info)
    return model, info


def _fit(steps, seed, batch_size, block_size, lr, threads, progress, evals):
    steps = check_int("steps", steps, 1, MAX_STEPS, " (the most is days of training on two cores)")
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tok = CharTokenizer()
        train_tokens, val_tokens = load_data(tok)
        cfg = GPTConfig(vocab_size=tok.vocab_size)

        torch.manual_seed(seed)
        model = TinyGPT(cfg)
        gen = torch.Generator().manual_seed(seed)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=(0.9, 0.99),
        )
        warmup = max(1, min(50, steps // 10))
        eval_at = {round(steps * (k + 1) / evals) for k in range(evals)}

        # Window starts: story starts (position 0 or right after an EOS) and anywhere.
        last_start = len(train_tokens) - block_size - 1
        story_starts = torch.cat([torch.tensor([0]), (train_tokens == tok.eos_id).nonzero().flatten() + 1])
        story_starts = story_starts[story_starts <= last_start]
        offsets = torch.arange(block_size + 1)

        model.train()
        t0 = time.perf_counter()
        losses = {}
        bar = tqdm(range(steps), desc="training", disable=not progress)
        for step in bar:
            anywhere = torch.randint(0, last_start + 1, (batch_size,), generator=gen)
            at_story = story_starts[torch.randint(0, len(story_starts), (batch_size,), generator=gen)]
            starts = torch.where(torch.rand(batch_size, generator=gen) < 0.5, at_story, anywhere)
            chunk = train_tokens[starts[:, None] + offsets]  # [B, T+1]
            logits = model(chunk[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten())

            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, lr, warmup)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            if step + 1 in eval_at:
                losses = {
                    "train_loss": evaluate(model, train_tokens, block_size),
                    "val_loss": evaluate(model, val_tokens, block_size),
                }
                if progress:
                    try:
                        bar.write(f"step {step + 1}: train {losses['train_loss']:.4f}  "
                                  f"val {losses['val_loss']:.4f}")
                    except OSError:  # stdout closed (`| head`) or full: train on, unreported
                        progress = False
        seconds = time.perf_counter() - t0
        model.eval()
    finally:
        torch.set_num_threads(prev_threads)

    info = {
        "steps": steps, "seed": seed, "batch_size": batch_size, "block_size": block_size, "lr": lr,
        **losses, "train_seconds": round(seconds, 1), "torch_version": str(torch.__version__),
    }
    return model, info


def main(argv=None) -> int:
    cfg = GPTConfig(vocab_size=CharTokenizer().vocab_size)
    full = (MAX_STEP_GIB << 30) // step_bytes(1, cfg.context_len, cfg)
    p = Parser(prog="train", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=whole_number(1, MAX_STEPS), default=800,
                   help=f"optimizer steps (at most {MAX_STEPS:,})")
    p.add_argument("--out", default=str(CHECKPOINT),
                   help="where to write the checkpoint (default: the shipped one, which the "
                        "defaults reproduce)")
    p.add_argument("--seed", type=whole_number(0, 2**63 - 1), default=0,
                   help="seed for initialisation and batch sampling")
    p.add_argument("--batch-size", type=whole_number(1, 4096), default=16,
                   help=f"windows per step (a step may take {MAX_STEP_GIB} GiB: at most {full} "
                        f"full windows)")
    p.add_argument("--block-size", type=whole_number(1, cfg.context_len), default=256,
                   help="tokens per training window")
    p.add_argument("--lr", type=finite_number(1e-9, 10.0), default=5e-3,
                   help="peak learning rate (warm-up, then cosine decay)")
    p.add_argument("--threads", type=whole_number(1, 1024), default=2,
                   help="torch threads; a fixed count keeps runs bit-identical")
    p.add_argument("--sample", type=whole_number(0, 100_000), default=250,
                   help="chars of greedy sample to print (0: none)")
    a = p.parse_args(argv)
    try:
        out = out_file(a.out, "--out", "tiny_gpt.pt")
        model, info = train(a.steps, a.seed, a.batch_size, a.block_size, a.lr, a.threads, out=out)
    except ValueError as err:
        return fail("train", err)
    except OSError as err:
        return fail("train", f"cannot write the checkpoint: {os_problem(err)}")
    except (MemoryError, RuntimeError) as err:
        if not out_of_memory(err):
            raise
        return fail("train", f"ran out of memory training --batch-size {a.batch_size} windows of "
                             f"--block-size {a.block_size} (about "
                             f"{step_bytes(a.batch_size, a.block_size, cfg) / 2**30:.1f} GiB a "
                             f"step): lower --batch-size; the checkpoint was not written")
    except KeyboardInterrupt:  # nothing was written: the checkpoint is saved whole or not at all
        return interrupted("train")
    print(f"{model.num_params():,} parameters; saved {out}")
    print({k: info[k] for k in ("train_loss", "val_loss", "train_seconds")})
    if a.sample > 0:
        print(repr(sample_text(model, CharTokenizer(), "Once", a.sample)))
    return 0


if __name__ == "__main__":
    run("train", main)
