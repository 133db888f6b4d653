"""What the checks' shared devices keep for good, as a digest: a learner's kernel that changed a
device's weights shows as a different one (``checks.pool.heal``), and so does a model that
reached a device changed on its way there (``checks.pool.engine``).  A light module: a device
process imports it to run :func:`verify`, and torch is all it needs."""

import _signal
import contextlib
import functools
import hashlib
import os
import signal
import sys
import sysconfig
import threading
import time

import torch

import toy_engine
from toy_engine.validate import plugin_label

# A module's own tensors and submodules: read by value below, not as its settings
_HELD = ("_parameters", "_buffers", "_modules")


def fingerprint(model, ngram_table, num_drafts: int, block_size: int) -> str:
    """A digest of the model and the drafter's table, the same on the host and on any device
    (their bytes, not float sums)."""
    return combined(model_print(model), table_print(ngram_table), num_drafts, block_size)


def combined(model: str, table: str, num_drafts: int, block_size: int) -> str:
    """:func:`fingerprint` from the model's and the table's own digests."""
    return hashlib.sha256(repr((model, table, num_drafts, block_size)).encode()).hexdigest()


def model_print(model) -> str:
    """A digest of the model as a device runs it: each module's class and settings (its instance
    attributes other than its tensors and submodules: a changed ``n_head``, a ``forward`` or a
    hook set on it, its ``training`` flag) and the bytes of its weights."""
    digest = hashlib.sha256(repr(type(model).__qualname__).encode())
    for name, module in model.named_modules():
        settings = sorted((k, repr(v)) for k, v in vars(module).items() if k not in _HELD)
        kind = type(module)
        digest.update(repr((name, kind.__module__, kind.__qualname__, settings)).encode())
    for name, t in list(model.state_dict().items()):
        digest.update(name.encode())
        _tensor(digest, t)
    return digest.hexdigest()


def table_print(ngram_table) -> str:
    """A digest of the drafter's table (None: an engine without drafts has none)."""
    digest = hashlib.sha256(b"ngram")
    if ngram_table is not None:
        _tensor(digest, ngram_table)
    return digest.hexdigest()


def _tensor(digest, t) -> None:
    digest.update(repr((str(t.dtype), tuple(t.shape))).encode())
    digest.update(t.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy())


def verify(ctx, expected: str) -> None:
    """A kernel: raise (a sticky device error) unless the device's model and lasting state are
    as the engine built them."""
    st = ctx.state
    found = fingerprint(ctx.model, st.get("ngram_table"), st.get("num_drafts"), ctx.block_size)
    if found != expected:
        raise RuntimeError("the device's model or lasting state is not as the engine built it")



class WrongKeyLengths(ValueError):
    """A batch of a run whose corrected ``seqlens_k`` is not the engine's own correction's."""


class ChangedInputs(ValueError):
    """A batch of a run whose correction changed what it must leave alone (``changed_inputs``)."""


class StillRunning(ValueError):
    """A batch of a run whose correction was still running at the run's deadline, raised where
    it was (:func:`_time_limited`)."""


class EndsProcess(ValueError):
    """Learner code called ``os._exit`` (:func:`signals_kept`)."""


#: What exercise 04's correction corrects; every other field of ``meta`` is an input it reads.
CORRECTED = ("seqlens_k", "positions", "slot_mapping")


def changed_inputs(given: dict, was, meta: dict, accepted) -> str | None:
    """What a correction changed that it must leave alone, given ``meta`` and ``accepted`` as
    they were before it (``given``, ``was``): a corrected field's dtype (a kernel indexes with
    integer lengths, positions and slots), ``accepted`` (the host reads it after the round to
    commit tokens), or a field it does not correct; None when it changed none of them."""
    for name in CORRECTED:
        now = meta.get(name)
        if isinstance(now, torch.Tensor) and now.dtype != given[name].dtype:
            return (f"`meta['{name}']` is now {now.dtype}, the host wrote {given[name].dtype}: a "
                    "kernel reads lengths, positions and slots as whole numbers, so keep each "
                    "field's dtype (`+=` and `.copy_` keep it)")
    if not _same(accepted, was):
        return (f"your correction changed `accepted`: it held {_shown(was, accepted)} and now "
                f"holds {_shown(accepted, was)}. The host reads those counts after the round to "
                "commit each request's tokens: read `accepted`, never write it")
    for name, held in given.items():
        if name not in CORRECTED and not _same(meta.get(name), held):
            now = meta.get(name)
            return (f"your correction changed `meta['{name}']`: it held {_shown(held, now)} and "
                    f"now holds {_shown(now, held)}. Only "
                    f"{', '.join(CORRECTED)} are corrected; the other fields are inputs the "
                    "forward and the next rounds read as the host wrote them")
    return None


def _same(now, held: torch.Tensor) -> bool:
    return (isinstance(now, torch.Tensor) and now.dtype == held.dtype
            and now.shape == held.shape and now.equal(held))


def _shown(value, other) -> str:
    """A tensor's values, with its dtype where ``other``'s differs; another value's type."""
    if not isinstance(value, torch.Tensor):
        return "nothing" if value is None else f"a {type(value).__name__}"
    differs = isinstance(other, torch.Tensor) and other.dtype != value.dtype
    return f"{value.dtype} {value.tolist()}" if differs else str(value.tolist())


def watched_correction(correction, deadline: float):
    """``correction`` as exercise 04's engine runs call it, each batch's ``seqlens_k`` then
    compared with the engine's own correction of the same inputs; a difference raises
    WrongKeyLengths (a sticky device error).  The toy's attention masks keys by position and
    never reads ``seqlens_k``, so its tokens cannot show a wrong one; a real kernel's would.
    A batch whose correction changed an input or a field's dtype raises ChangedInputs; one
    still running at ``deadline`` (``time.monotonic``, every process's clock) StillRunning."""
    from toy_engine.kernels import correct_seqlens_qk  # the engine's: a device process has it

    @functools.wraps(correction)
    def watched(meta, accepted, block_size):
        given = {name: t.clone() for name, t in meta.items()}
        was = accepted.clone()
        want = {name: t.clone() for name, t in given.items()}
        correct_seqlens_qk(want, was.clone(), block_size)
        answer = _time_limited(correction, deadline, meta, accepted, block_size)
        got, right = meta.get("seqlens_k"), want["seqlens_k"]
        if not (isinstance(got, torch.Tensor) and got.shape == right.shape and got.equal(right)):
            raise WrongKeyLengths(_key_lengths_differ(given, was, got, right))
        changed = changed_inputs(given, was, meta, accepted)
        if changed:
            raise ChangedInputs(f"in a batch of {len(given['seqlens_q'])} request(s), {changed}")
        return answer
    watched.label = plugin_label(correction)  # what the engine's messages name: the learner's
    return watched


# Not the learner's code: the engine, the course, the standard library and installed packages
_NOT_LEARNERS = (os.path.dirname(os.path.abspath(__file__)),
                 os.path.dirname(os.path.abspath(toy_engine.__file__)),
                 *{sysconfig.get_paths()[k]
                   for k in ("stdlib", "platstdlib", "purelib", "platlib")})
_AT_LEAST_S = 2.0  # a correction of one batch takes milliseconds: one running 2 s never ends


def _time_limited(correction, deadline: float, *args):
    """``correction(*args)``, stopped by StillRunning (naming the learner's line it was at) once
    ``deadline`` has passed, or at least ``_AT_LEAST_S``: in a device process, whose hang the
    host's time limit would find only as the host's own wait (blind round 27: "at line 1 of
    `<lambda>`").  Where a check's limit already traces the code (a CUDA device runs it in the
    host's thread), or off the main thread, or with an alarm armed, that limit stops it."""
    if (sys.gettrace() is not None or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()
            or signal.getitimer(signal.ITIMER_REAL)[0] > 0):
        return correction(*args)
    started, noted = time.monotonic(), []

    def stop(signum, frame):
        kept = f" (it had called {', '.join(noted)}, which would have changed the device " \
               "process's signals and its time limit: the checker did not make the call)" \
            if noted else ""
        raise StillRunning(f"still running after {time.monotonic() - started:.0f} s"
                           f"{_learners_line(frame)}{kept}")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - started, _AT_LEAST_S), 0.05)
    try:
        with signals_kept(noted):
            return correction(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _learners_line(frame) -> str:
    """", at line N of `f`": the innermost of the learner's frames from ``frame`` out, or ""."""
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_LEARNERS):
        frame = frame.f_back
    return "" if frame is None else f", at line {frame.f_lineno} of `{frame.f_code.co_name}`"


@contextlib.contextmanager
def signals_kept(noted: list):
    """While a learner's correction runs in a device process, its calls that would change the
    process's signals -- ``signal.signal``, ``alarm``, ``setitimer``, ``pthread_sigmask`` -- are
    noted in ``noted`` with their line and not made: the checker's time limit uses them (round
    28: an endless loop told as the host's wait).  The checker's, the engine's and the
    libraries' own calls go through.  ``os._exit`` raises EndsProcess, its line named.  Not used
    in the checker's own process, where the grading judge refuses stand-ins in ``signal`` and
    ``os``: a check puts back the handlers its code changed instead (``harness``)."""
    was = os._exit

    def stand_in(name, real, made):
        def call(*args):
            frame = sys._getframe(1)
            if frame.f_code.co_filename.startswith(_NOT_LEARNERS):
                return real(*args)
            noted.append(f"`{_shown_call(name, args)}`{_learners_line(frame)[1:]}")
            return made(*args)
        return call

    def exit_(code, /):
        raise EndsProcess(f"called `os._exit({code!r})`{_learners_line(sys._getframe(2))}, "
                          f"which ends the device process (and the run with it)")
    made = {"alarm": lambda *a: 0, "setitimer": lambda which, *a: signal.getitimer(which),
            "signal": lambda num, *a: signal.getsignal(num),
            "pthread_sigmask": lambda *a: _signal.pthread_sigmask(signal.SIG_BLOCK, [])}
    saved = [(module, {n: vars(module)[n] for n in made}) for module in (signal, _signal)]
    for module, held in saved:
        vars(module).update({n: stand_in(n, held[n], made[n]) for n in made})
    os._exit = stand_in("_exit", was, exit_)
    try:
        yield
    finally:
        os._exit = was
        for module, held in saved:
            vars(module).update(held)


def _shown_call(name: str, args: tuple) -> str:
    """A noted call as the learner wrote it: ``os._exit(3)``, ``signal.alarm(1)``,
    ``signal.signal(signal.SIGINT, ...)``: the number, or the signal's or timer's name."""
    if name in ("_exit", "alarm") or not args:
        return f"{'os' if name == '_exit' else 'signal'}.{name}({', '.join(map(repr, args))})"
    first = args[0]
    timers = {getattr(signal, t): t for t in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
              if name == "setitimer" and hasattr(signal, t)}
    shown = getattr(first, "name", None) if name != "setitimer" else timers.get(first)
    return f"signal.{name}({'signal.' + shown if shown else repr(first)}, ...)"


def _key_lengths_differ(given: dict, accepted, got, right) -> str:
    shown = got.tolist() if isinstance(got, torch.Tensor) else type(got).__name__
    q = given["seqlens_q"].tolist()
    return (f"a batch of {len(q)} request(s) of {q[0] if q else 0} tokens each (rows "
            f"{given['rows'].tolist()}, pending {given['pending'].tolist()}, accepted drafts by "
            f"row {accepted[given['rows']].tolist()}, the host's seqlens_k "
            f"{given['seqlens_k'].tolist()}): your seqlens_k is {shown}, expected {right.tolist()}")


def watched_message(err: BaseException, kind: type) -> str | None:
    """What a run's ``kind`` (WrongKeyLengths or ChangedInputs) said, raised here (a CUDA device
    runs kernels in this process) or reported by a device process (``"WrongKeyLengths: ... (in
    kernel ...)"``)."""
    if isinstance(err, kind):
        return str(err)
    text, mark = str(err), f"{kind.__name__}: "
    if not text.startswith(mark):
        return None
    return text[len(mark):].rpartition(" (in kernel")[0] or text[len(mark):]
