"""The title-case sampling constraint: built on the host from committed text, so serial and
ZOS agree token for token, and sampling before the previous postprocess gets it wrong."""

import pytest
import torch

import toy_engine as te
from toy_engine.constraint import TitleCase

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said "]


def sample_before_postprocess(engine):
    """The ZOS loop with the last two stages swapped: forward, sample, then the previous step."""
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        current = engine.launch_sample(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


def after_space(text):
    return [b for a, b in zip(text, text[1:]) if a == " "]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_serial_equals_zos_with_the_constraint_and_every_word_is_capitalised(engine_pool, temperature):
    kw = dict(max_new_tokens=40, temperature=temperature, seed=5)
    serial = engine_pool(mode="serial", max_batch_size=3, constraint="title_case").generate(PROMPTS, **kw)
    zos = engine_pool(mode="zos", max_batch_size=3, constraint="title_case").generate(PROMPTS, **kw)
    assert [c.token_ids for c in zos] == [c.token_ids for c in serial]
    for c in serial:
        assert all(ch.isupper() for ch in after_space(c.prompt[-1] + c.text)), c.text
    plain = engine_pool(mode="serial", max_batch_size=3).generate(PROMPTS, **kw)
    assert [c.text for c in plain] != [c.text for c in serial]  # the constraint really changes the text


def test_sampling_before_the_previous_postprocess_builds_a_stale_mask(engine_pool):
    zos = engine_pool(mode="zos", max_batch_size=3, constraint="title_case")
    right = zos.generate(PROMPTS, max_new_tokens=40)
    wrong = zos.generate(PROMPTS, max_new_tokens=40, loop=sample_before_postprocess)
    assert [c.token_ids for c in wrong] != [c.token_ids for c in right]
    # the mask lags one token: lower-case letters after spaces, capitals one character later
    lowered = [ch for c in wrong for ch in after_space(c.text) if ch.islower()]
    assert len(lowered) >= 5, [c.text for c in wrong]
    # without the constraint the same swapped loop gives the reference text: only the mask needs the order
    plain = engine_pool(mode="zos", max_batch_size=3)
    assert ([c.token_ids for c in plain.generate(PROMPTS, max_new_tokens=40, loop=sample_before_postprocess)]
            == [c.token_ids for c in plain.generate(PROMPTS, max_new_tokens=40)])


def test_mask_reads_only_the_newest_committed_token():
    tok = te.CharTokenizer()
    rule = TitleCase(tok)

    class Req:
        def __init__(self, prompt, out=""):
            self.prompt_ids, self.output_ids = tok.encode(prompt), tok.encode(out)

    allowed = rule.masks([Req("a "), Req("a"), Req("The", " "), Req("The ", "x")])
    assert allowed.shape == (4, tok.vocab_size) and allowed.dtype == torch.bool
    capitals = [tok.encode(c)[0] for c in "AQZ"]
    assert allowed[0, capitals].all() and allowed[0].sum() == 26
    assert allowed[1].all() and allowed[3].all()
    assert allowed[2].sum() == 26


def test_bad_constraint_settings_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="unknown constraint 'grammar'.*title_case"):
        te.EngineConfig(constraint="grammar").validate()
    with pytest.raises(ValueError, match="needs num_draft_tokens=0 \\(got 2\\).*drafts"):
        te.EngineConfig(constraint="title_case", num_draft_tokens=2).validate()
