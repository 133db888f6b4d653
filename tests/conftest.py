import pytest

import toy_engine as te


@pytest.fixture(scope="session")
def shipped():
    """The shipped model and its alphabet, loaded once."""
    return te.load_model()


@pytest.fixture
def make_engine(shipped):
    """Engines on the shipped model, closed (device process stopped) after the test."""
    engines = []

    def make(**config):
        model, alphabet = shipped
        engine = te.Engine(te.EngineConfig(**config), model=model, tokenizer=te.CharTokenizer(alphabet))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture(scope="module")
def engine_pool(shipped):
    """Engines shared by a module's tests, one per configuration (device start-up is not free)."""
    model, alphabet = shipped
    pool = {}

    def get(**config):
        key = tuple(sorted(config.items()))
        if key not in pool:
            pool[key] = te.Engine(te.EngineConfig(**config), model=model, tokenizer=te.CharTokenizer(alphabet))
        return pool[key]

    yield get
    for engine in pool.values():
        engine.close()
