"""The published overlap speed-ups :mod:`overlap_course.figures.payoff` draws, each with what
was measured on what workload, where the figure places it and its source: data, kept apart from
the figure that draws it.

Engines publish speed-ups, rarely per-round times, so each number is drawn at the host share its
source gives or implies (:func:`implied_host_share`, the share whose ideal is that speed-up).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Published", "PUBLISHED", "implied_host_share"]


def implied_host_share(speedup: float) -> float:
    """The host share (device-bound side) whose ideal is ``speedup``, between 1 and 2: where a
    published speed-up sits if its overlap hid all of the host's work."""
    return 1 - 1 / speedup


@dataclass(frozen=True)
class Published:
    """A published overlap speed-up and where the figure draws it."""
    engine: str
    speedup: tuple[float, float]      # low, high (x); one number: twice the same
    host_share: tuple[float, float]   # where it is drawn, as speedup
    drawn_at: str                     # how host_share was obtained
    measured: str                     # what the number is
    workload: str
    not_the_toy: str                  # why a toy's ratio is not comparable one to one
    reference: str                    # the repository and PR, or the document
    url: str
    date: str                         # published (ISO)
    expected: bool = False            # a forecast in the source, not a measurement
    ceiling: bool = False             # the most its measured host share allows, not a speed-up
    counter: bool = False             # a run where overlap bought nothing: drawn at x1


_SGLANG, _VLLM = 1.1, (1.05, 1.10)
_HF_SYNC_S, _HF_ASYNC_S, _HF_IDLE = 300.6, 234.5, 0.240
# SGLang's spec v2 (overlap with speculation) against spec v1, as each PR measured it
_SPEC_FA3 = 159.71 / 140.52           # tokens/s of one request, DeepSeek-R1 (#12128)
_SPEC_QWEN_NEXT = 16373 / 14293       # total token throughput, Qwen3-Next-80B-A3B (#15591)
_SPEC_DFLASH = 12360.49 / 9688.26     # tokens/s, Qwen3-8B with a DFlash drafter on B200 (#20547)
_VLLM_PP = 1.308                      # end-to-end throughput, async scheduling + PP=4 (#32618)
_LLAMA_CPU = (0.10, 0.15)             # CPU share of each token's critical path, A100/H100 (#7456)

PUBLISHED = (
    Published(
        engine="SGLang v0.4, overlap scheduler",
        speedup=(_SGLANG, _SGLANG),
        host_share=(implied_host_share(_SGLANG),) * 2,
        drawn_at="implied: the post gives no host share, so the point sits where the ideal "
                 "equals x1.1, as if the overlap hid all host work (its profile shows no GPU "
                 "idle)",
        measured="serving throughput of v0.4 with its overlap (\"zero-overhead\") batch "
                 "scheduler against the same server with overlap disabled: x1.1; an Nsight "
                 "profile of 5 consecutive decode batches shows no idle GPU time (Triton "
                 "attention backend; FlashInfer still left a small gap). The post says the gain "
                 "is largest for small models and large tensor-parallel sizes.",
        workload="Llama-3.2-3B-Instruct, sglang.bench_serving: 500 random prompts, 4096 input "
                 "and 2048 output tokens each (the GPU is not named)",
        not_the_toy="whole-run throughput of a serving benchmark, prefill included, on a GPU "
                    "where a 3B model's forward is long against the host's scheduling and "
                    "radix-cache work",
        reference="LMSYS blog, \"SGLang v0.4\" (lm-sys/lm-sys.github.io, "
                  "blog/2024-12-04-sglang-v0-4.md)",
        url="https://lmsys.org/blog/2024-12-04-sglang-v0-4/",
        date="2024-12-04"),
    Published(
        engine="Hugging Face transformers, asynchronous continuous batching",
        speedup=(_HF_SYNC_S / _HF_ASYNC_S,) * 2,
        host_share=(_HF_IDLE,) * 2,
        drawn_at="measured: the synchronous run's GPU was idle 24.0% of the time, waiting for "
                 "the host, which is the host's share when the two take turns",
        measured="total generation time, synchronous vs asynchronous continuous batching "
                 "(separate CUDA streams for upload, compute and download, two alternating "
                 "input/output slots, sampled tokens carried over on the GPU): 300.6 s to 234.5 "
                 "s, 22% less time (x1.28); GPU active 76.0% to 99.4% of the run. The post's own "
                 "ceiling, all idle time removed, was x1.32; it names the one sync per batch as "
                 "the rest.",
        workload="an 8B model generating 8K tokens at batch size 32 (the GPU is not named)",
        not_the_toy="one long decode-heavy generation on a GPU with a real model; the idle share "
                    "comes from a profile of that run",
        reference="Hugging Face blog, \"Unlocking asynchronicity in continuous batching\" "
                  "(huggingface/blog, continuous_async.md)",
        url="https://huggingface.co/blog/continuous_async",
        date="2026-05-14"),
    Published(
        engine="vLLM, fully overlapped model runner",
        speedup=_VLLM,
        host_share=tuple(implied_host_share(s) for s in _VLLM),
        drawn_at="implied: where the ideal equals the expected 5-10%, i.e. the host work the "
                 "earlier async scheduling still left exposed",
        measured="an expected speed-up stated in the PR's description, not a benchmark: 5-10% "
                 "over vLLM's async scheduling of the time (PR #19970, which already ran the "
                 "scheduler a step ahead); this PR also overlaps the model runner's input "
                 "preparation and the copy of sampled tokens to Python (a worker thread waits "
                 "for the GPU) with the next forward",
        workload="none given (an expectation); the PR did not yet cover speculative decoding, "
                 "pipeline parallelism or structured output",
        not_the_toy="its baseline was already partly overlapped: a second step on top of async "
                    "scheduling, not serial against overlapped",
        reference="vllm-project/vllm PR #23569, \"[Perf][V1] Fully overlap model execution\"",
        url="https://github.com/vllm-project/vllm/pull/23569",
        date="2025-08-25", expected=True),
    Published(
        engine="SGLang spec v2 on FA3 (DeepSeek-R1)",
        speedup=(_SPEC_FA3,) * 2,
        host_share=(implied_host_share(_SPEC_FA3),) * 2,
        drawn_at="implied: the PR gives no host share; drawn where the ideal equals its gain",
        measured="decode speed of one request (sglang.test.send_one, 512 tokens) with EAGLE "
                 "drafts, spec v1 against the overlapped spec v2: 140.52 to 159.71 tokens/s, "
                 "same acceptance length (2.296); the PR calls it about 13% and names slow "
                 "kernels as what was left",
        workload="DeepSeek-R1 on 8 GPUs (TP 8), FA3 MLA attention, the default for DeepSeek on "
                 "Hopper",
        not_the_toy="one request at a time on a 671B model across 8 GPUs, with a draft model's "
                    "forwards in each round: host work per round includes the drafter's "
                    "scheduling",
        reference="sgl-project/sglang PR #12128, \"Support overlap-spec-v2 with fa3 attention "
                  "backend\" (closed)",
        url="https://github.com/sgl-project/sglang/pull/12128",
        date="2025-10-25"),
    Published(
        engine="SGLang spec v2 (Qwen3-Next-80B-A3B)",
        speedup=(_SPEC_QWEN_NEXT,) * 2,
        host_share=(implied_host_share(_SPEC_QWEN_NEXT),) * 2,
        drawn_at="implied: the PR gives no host share; drawn where the ideal equals its gain",
        measured="total token throughput of a serving benchmark, spec v1 against spec v2 (NEXTN "
                 "drafts, 3 steps, 4 draft tokens): 14,293 to 16,373 tokens/s, +14.5%",
        workload="Qwen3-Next-80B-A3B-Instruct, TP 4; sglang.bench_serving with generated shared "
                 "prefixes: 512 prompts in 32 groups, 2,048-token system prompts, 256 output "
                 "tokens, 10 requests/s (the GPU is not named)",
        not_the_toy="a served workload with prefills and a prefix cache, at a fixed arrival "
                    "rate: part of the gain is shorter queues, not only hidden host work",
        reference="sgl-project/sglang PR #15591, \"Add Spec V2 for Qwen 3 next\" (closed)",
        url="https://github.com/sgl-project/sglang/pull/15591",
        date="2025-12-22"),
    Published(
        engine="SGLang spec v2 with DFlash (B200)",
        speedup=(_SPEC_DFLASH,) * 2,
        host_share=(implied_host_share(_SPEC_DFLASH),) * 2,
        drawn_at="implied: the PR gives no host share; drawn where the ideal equals its gain",
        measured="throughput of a GSM8K sweep, spec v1 against spec v2 (overlap scheduling) with "
                 "a DFlash block drafter: 9,688.26 to 12,360.49 tokens/s, +27.6%",
        workload="Qwen3-8B on one B200 (TP 1), 32 concurrent requests, up to 2,048 new tokens, "
                 "greedy",
        not_the_toy="an 8B model on one B200: each forward is short, so the host's share, and what "
                    "overlap can hide, is large; the drafter's work is part of each round",
        reference="sgl-project/sglang PR #20547, \"Add spec v2 (overlap scheduling) to DFlash "
                  "speculative decoding support\" (closed)",
        url="https://github.com/sgl-project/sglang/pull/20547",
        date="2026-03-13"),
    Published(
        engine="vLLM async scheduling with pipeline parallelism",
        speedup=(_VLLM_PP,) * 2,
        host_share=(implied_host_share(_VLLM_PP),) * 2,
        drawn_at="implied: the PR gives no host share; drawn where the ideal equals its gain",
        measured="end-to-end throughput with async scheduling against without it, both with 4 "
                 "pipeline stages: +30.8%, and 31.8% lower time per output token",
        workload="Qwen3-30B-A3B-Thinking-2507-FP8, PP 4, at most 128 sequences; vllm bench "
                 "serve, 128 random prompts of 2 input and 512 output tokens (the GPUs are not "
                 "named)",
        not_the_toy="four pipeline stages on four GPUs: without async scheduling each step also "
                    "waits for the last stage's tokens to come back, a wait a one-device toy "
                    "does not have",
        reference="vllm-project/vllm PR #32618, \"Fully support for async scheduling + PP\"",
        url="https://github.com/vllm-project/vllm/pull/32618",
        date="2026-01-19"),
    Published(
        engine="llama.cpp, CPU work per token",
        speedup=tuple(1 / (1 - c) for c in _LLAMA_CPU),
        host_share=_LLAMA_CPU,
        drawn_at="measured: the CPU's share of each token's critical path, 10-15%; drawn at the "
                 "most overlap could give there",
        measured="a timing breakdown of each token's critical path: executing the CUDA graph "
                 "takes about 85-90% of it, CPU work (preparing the GGML graph among it) the "
                 "remaining 10-15%; so hiding all CPU work gives at most x1.11-1.18",
        workload="Llama 2 7B and 13B, Q4_K_M, one sequence, on A100 and H100",
        not_the_toy="a ceiling from a profile, not a measured overlap; one sequence at a time, "
                    "where the GPU's share is large",
        reference="ggml-org/llama.cpp issue #7456, \"Optimisation of per-token CPU activities "
                  "for GPU inference\" (closed)",
        url="https://github.com/ggml-org/llama.cpp/issues/7456",
        date="2024-05-22", ceiling=True),
    Published(
        engine="SGLang spec v2 on H800, no gain",
        speedup=(1.0, 1.0),
        host_share=(0.0, 0.0),
        drawn_at="implied: no gain means no host work was left to hide, the device-bound end",
        measured="a user's port of spec v2's full overlap: the trace shows the overlap, but the "
                 "time per output token stays at about 14.3 ms before and after",
        workload="Qwen3.5-122B (hybrid linear attention) with NEXTN drafts, TP 4 + DP 4, the "
                 "decode side of a prefill/decode split, on H800",
        not_the_toy="the trace shows the overlap, so the host work it hid was not what bounded a "
                    "step; the comment does not say what did (a split deployment across 16 GPUs)",
        reference="sgl-project/sglang issue #23005, \"Speculative Decoding Development Roadmap "
                  "(2026 Q2)\", comment of 2026-05-08",
        url="https://github.com/sgl-project/sglang/issues/23005",
        date="2026-05-08", counter=True),
)
