"""Issue 34's eighth hostile round, the engine: ``engine.config`` replaced after the engine
was built (as the frozen config's message half-suggests); ``stop`` read on one pass and kept
from a second, str subclasses kept as given; ``abort``'s refusal listing every id of the run.
Each failed when written."""

from __future__ import annotations

import dataclasses

import pytest

import toy_engine as te

PROMPTS = ["Once upon a time", "One day", "There was a fox", "The bird said"]


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(max_batch_size=4)) as built:
        yield built


@pytest.fixture
def built(engine):
    """The engine's own config, put back after a test that replaces it (whatever the engine did)."""
    config = engine.config
    yield config
    engine.config = config


@pytest.fixture(scope="module")
def expected(engine):
    return [(c.text, c.token_ids) for c in engine.generate(PROMPTS, max_new_tokens=8)]


@pytest.mark.parametrize("field,value", [("block_size", 4), ("num_draft_tokens", 2),
                                         ("max_batch_size", 2)])
def test_a_replaced_config_is_refused_by_name_until_its_values_are_back(engine, built, expected,
                                                                        field, value):
    engine.config = dataclasses.replace(built, **{field: value})
    for _ in range(2):  # refused on every call, never a stall or an IndexError
        with pytest.raises(ValueError) as err:
            engine.generate(PROMPTS, max_new_tokens=8)
        message = str(err.value)
        assert f"engine.config was replaced after the engine was built ({field}={value})" in message
        assert "te.Engine(engine.config)" in message
    put_back = f"dataclasses.replace(engine.config, {field}={getattr(built, field)})"
    assert message.endswith(f"engine.config = {put_back}")
    engine.config = dataclasses.replace(engine.config, **{field: getattr(built, field)})
    assert [(c.text, c.token_ids) for c in engine.generate(PROMPTS, max_new_tokens=8)] == expected


def test_a_config_replaced_by_something_else_is_refused_and_an_equal_one_runs(engine, built,
                                                                              expected):
    engine.config = None
    with pytest.raises(TypeError, match="engine.config must stay the EngineConfig .* got NoneType"):
        engine.generate(PROMPTS, max_new_tokens=8)
    engine.config = dataclasses.replace(built)  # the same values: nothing to refuse
    assert [(c.text, c.token_ids) for c in engine.generate(PROMPTS, max_new_tokens=8)] == expected


def test_stop_is_read_once_and_kept_as_checked(engine):
    class Shifty(list):
        """A list whose later passes give an int (a generator-backed view would too)."""
        passes = 0

        def __iter__(self):
            Shifty.passes += 1
            return iter([" was"] if Shifty.passes == 1 else [5])

    plain = engine.generate(["There was a fox"], max_new_tokens=20, stop=[" was"])[0]
    shifty = engine.generate(["There was a fox"], max_new_tokens=20, stop=Shifty([" was"]))[0]
    assert (shifty.text, shifty.token_ids, shifty.finish_reason) == (
        plain.text, plain.token_ids, plain.finish_reason)
    assert Shifty.passes == 1
    assert [type(s) for s in engine.requests[0].stop] == [str]


class _Longer(str):
    def __len__(self):
        return 1000

    def __iter__(self):
        return iter("zzzz")


@pytest.mark.parametrize("stop", [_Longer(" "), [_Longer(" ")], (_Longer(" "),)],
                         ids=["str", "list", "tuple"])
def test_a_str_subclass_stop_is_used_as_its_text(engine, stop):
    plain = engine.generate(["Once upon a time"], max_new_tokens=20, stop=[" "])[0]
    odd = engine.generate(["Once upon a time"], max_new_tokens=20, stop=stop)[0]
    assert (odd.text, odd.token_ids) == (plain.text, plain.token_ids)


@pytest.mark.parametrize("prompts", [_Longer("Once upon a time"), [_Longer("Once upon a time")]],
                         ids=["str", "list"])
def test_a_str_subclass_prompt_is_used_as_its_text(engine, prompts):
    plain = engine.generate(["Once upon a time"], max_new_tokens=8)[0]
    odd = engine.generate(prompts, max_new_tokens=8)[0]
    assert (odd.text, odd.token_ids, odd.prompt) == (plain.text, plain.token_ids, plain.prompt)
    assert type(odd.prompt) is str and type(engine.requests[0].prompt) is str


def test_an_empty_str_subclass_is_refused_whatever_its_len(engine):
    class Full(str):
        def __len__(self):
            return 5

    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate(Full(""), max_new_tokens=1)
    with pytest.raises(ValueError, match="stop strings must be non-empty"):
        engine.generate("Once", max_new_tokens=1, stop=[Full("")])


def test_abort_names_the_run_ids_within_the_usual_cut(engine):
    engine.generate(["Once"] * 400, max_new_tokens=1)
    with pytest.raises(ValueError, match=r"no request 1000000000 in the current run") as err:
        engine.abort(10**9)
    assert len(str(err.value)) <= 200, str(err.value)
    assert "[" + str(engine.requests[0].id) in str(err.value)
