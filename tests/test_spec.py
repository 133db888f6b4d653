"""Speculative decoding under ZOS: on-device acceptance and seqlen correction."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from overlap_course import checks
from toy_engine import drafter, kernels
from overlap_course.measure.bench import default_workload

WORDS = ["Once upon a time", "One day", "There was a", "The little fox", "Once", "A", "She liked to"]


def test_worked_case_previous_round_accepted_one_draft():
    """k = 2 drafts, blocks of 4 slots.  Three decode requests whose previous round is
    still in flight (pending): it accepted 1 draft for row 0, none for row 2, all 2 for row 5.

    The host assumed each in-flight round adds one token, so for a request with 6
    committed tokens it planned inputs at positions 6, 7, 8 (the newest token + 2 drafts)
    and a key length of 9.  With one accepted draft the request really has 8 tokens
    once the in-flight round lands (6 + 1 accepted + 1 bonus): positions 7, 8, 9, key length 10.
    """
    meta, accepted, _ = checks.worked_case()  # the notebook's and checker's case
    bs = 4
    assert meta["positions"].tolist() == [6, 7, 8, 3, 4, 5, 10, 11, 12]  # the host's stale plan
    assert meta["block_tables"][0].tolist() == [3, 7, 1, 0] and accepted[[0, 2, 5]].tolist() == [1, 0, 2]
    state = {
        "accepted": accepted,
        "last_tokens": torch.tensor([40, 0, 41, 0, 0, 42, 0, 0]),
        "drafts": torch.tensor([[10, 11]] + [[0, 0]] + [[20, 21]] + [[0, 0]] * 2 + [[30, 31]] + [[0, 0]] * 2),
    }
    kernels.correct_seqlens_qk(meta, state["accepted"], bs)
    assert meta["seqlens_q"].tolist() == [3, 3, 3]  # query layout (cu_seqlens_q) unchanged
    assert meta["seqlens_k"].tolist() == [10, 6, 15]
    assert meta["positions"].tolist() == [7, 8, 9, 3, 4, 5, 12, 13, 14]
    # row 0: pos 7 -> block 7 slot 3 = 31; pos 8 -> block 1 slot 0 = 4; pos 9 -> 5
    assert meta["slot_mapping"].tolist() == [31, 4, 5, 11, 16, 17, 20, 21, 22]
    # input ids: the newest (bonus) token, then the drafts proposed after it, all from the device
    assert kernels.resolve_input_ids(meta, state).tolist() == [40, 10, 11, 41, 20, 21, 42, 30, 31]


def test_nothing_changes_for_requests_the_host_already_committed():
    meta = {"positions": torch.tensor([5, 6]), "seqlens_q": torch.tensor([2]), "seqlens_k": torch.tensor([7]),
            "rows": torch.tensor([1]), "pending": torch.tensor([0]), "slot_mapping": torch.tensor([5, 6]),
            "block_tables": torch.tensor([[0, 1]])}
    kernels.correct_seqlens_qk(meta, torch.tensor([0, 3]), 4)
    assert meta["positions"].tolist() == [5, 6] and meta["seqlens_k"].tolist() == [7]


def test_acceptance_is_the_longest_matching_prefix_plus_a_bonus():
    """Drive the sample kernel directly: row 0 accepts 0 drafts, row 1 all k = 3."""
    V, k = 6, 3
    logits = torch.full((8, V), -10.0, dtype=torch.float64)
    target = [[2, 5, 1, 4], [3, 1, 4, 0]]  # the target model's argmax at each of the 4 positions
    for b in range(2):
        for i, tok in enumerate(target[b]):
            logits[b * 4 + i, tok] = 10.0
    drafts = [[1, 1, 4], [3, 1, 4]]  # row 0's first draft is wrong; row 1's are all right
    meta = {
        "input_ids": torch.tensor([7 % V] + drafts[0] + [2] + drafts[1]),
        "positions": torch.tensor([4, 5, 6, 7, 9, 10, 11, 12]),
        "seqlens_q": torch.tensor([4, 4]), "rows": torch.tensor([0, 1]),
        "seeds": torch.tensor([0, 0]), "temperature": torch.zeros(2, dtype=torch.float64),
    }
    out = torch.zeros(2 * (k + 2), dtype=torch.long)
    table = torch.zeros(V ** (drafter.NGRAM - 1), dtype=torch.long)
    state = {"inputs": meta, "logits": logits, "num_drafts": k, "ngram_table": table,
             "last_tokens": torch.zeros(2, dtype=torch.long), "accepted": torch.zeros(2, dtype=torch.long),
             "drafts": torch.zeros(2, k, dtype=torch.long), "history": torch.tensor([[3, 4, 5], [0, 1, 2]])}
    ctx = SimpleNamespace(state=state, store=lambda name, value: out[: value.numel()].copy_(value))
    kernels.sample(ctx, 0, False)
    tokens, accepted = out[: 2 * (k + 1)].view(2, k + 1), out[2 * (k + 1):]
    assert tokens.tolist() == target
    assert accepted.tolist() == [0, 3]
    assert state["last_tokens"].tolist() == [2, 0]  # the bonus: first token after the accepted prefix
    # the drafter's context: the last 3 tokens once the emitted ones are appended
    assert state["history"].tolist() == [[4, 5, 2], [1, 4, 0]]


@pytest.fixture(scope="module")
def spec_engines(engine_pool):
    def get(mode, k=4, max_batch_size=4, correct=True):
        return engine_pool(mode=mode, num_draft_tokens=k, max_batch_size=max_batch_size, correct_seqlens=correct)
    return get


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
       max_new=st.integers(1, 40),
       stop=st.sampled_from([None, ["."], ["the", "fox"], ["ppi"]]),
       k=st.sampled_from([1, 4]),
       batch=st.sampled_from([1, 4]),
       temperature=st.sampled_from([0.0, 0.7]))
def test_speculative_outputs_equal_plain_serial(spec_engines, prompts, max_new, stop, k, batch, temperature):
    kw = dict(max_new_tokens=max_new, stop=stop, temperature=temperature, seed=11)
    expected = [(c.token_ids, c.finish_reason) for c in spec_engines("serial", 0, batch).generate(prompts, **kw)]
    for mode in ("serial", "zos"):
        got = spec_engines(mode, k, batch).generate(prompts, **kw)
        assert [(c.token_ids, c.finish_reason) for c in got] == expected, mode


def test_stops_inside_a_multi_token_step_trim_exactly(spec_engines):
    plain = spec_engines("serial", 0)
    ref = plain.generate(["Once upon a time"], max_new_tokens=60)[0]
    zos = spec_engines("zos", 4)
    for n in range(1, 13):  # the length limit falls at every offset inside a 5-token step
        out = zos.generate(["Once upon a time"], max_new_tokens=n)[0]
        assert out.token_ids == ref.token_ids[:n] and out.finish_reason == "length"
    for stop in (ref.text[7:9], ref.text[30:33]):
        out = zos.generate(["Once upon a time"], max_new_tokens=60, stop=[stop])[0]
        assert out.finish_reason == "stop" and out.text == ref.text[: ref.text.index(stop)]
    ending = "Once upon a time, there was a fox named Leo.\nAnd they all lived happily ever"
    out = zos.generate([ending], max_new_tokens=20)[0]
    assert (out.text, out.finish_reason) == (" after.", "eos")


def test_without_the_correction_tokens_go_wrong_and_with_it_they_do_not(spec_engines):
    prompts = default_workload(8)
    expected = [c.token_ids for c in spec_engines("serial", 0, 8).generate(prompts, max_new_tokens=48)]
    right = [c.token_ids for c in spec_engines("zos", 4, 8).generate(prompts, max_new_tokens=48)]
    wrong = [c.token_ids for c in spec_engines("zos", 4, 8, correct=False).generate(prompts, max_new_tokens=48)]
    assert right == expected
    assert sum(w != e for w, e in zip(wrong, expected)) >= len(prompts) // 2


def test_drafts_are_accepted_often_and_counted(spec_engines):
    engine = spec_engines("zos", 4, 8)
    engine.generate(default_workload(16), max_new_tokens=96)
    st_ = engine.stats
    assert st_.draft_tokens_proposed > 0
    assert 0 < st_.draft_tokens_accepted <= st_.draft_tokens_proposed
    assert st_.mean_accepted_per_round >= 1.0, st_.mean_accepted_per_round
    assert st_.tokens_per_forward > 8  # more than one token per request per forward
