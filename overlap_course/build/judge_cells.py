"""How a judge process runs the submission's cells: in order, in one namespace, as the
learner's kernel ran them -- IPython's own syntax (a magic that only times, shows or sets its
cell runs its cell as IPython does: ``%%timeit`` in a function of its own), its history
(``_``, ``__``, ``___``, ``_N``, ``Out``, ``In``) and
top-level ``await`` included: round nine's right answers written with them scored 0."""

from __future__ import annotations

import __future__
import ast
import builtins
import functools
import inspect
import io
import os
import operator
import re
import sys
import tokenize
import types

__all__ = ["run_cells"]


def run_cells(cells: list[str]) -> tuple[dict, list[str]]:
    """The submission's cells in order, as its kernel ran them: a cell that raises is noted
    and the next one runs (nbgrader runs notebooks with errors allowed)."""
    # the cells' namespace is ``__main__``'s while they run, as IPython makes it (dataclasses
    # reads a string ``ClassVar`` annotation through ``sys.modules[cls.__module__]``)
    boot, main = sys.modules.get("__main__"), types.ModuleType("__main__")
    space = main.__dict__
    space.update({"__builtins__": builtins, "display": lambda *a, **k: None,
                  "In": [""], "Out": {}, "_": "", "__": "", "___": ""})
    compiler = _Compiler()
    notes: list[str] = []
    space["get_ipython"] = lambda: _Magics(space, compiler, notes)
    history = _History(space)
    sys.modules["__main__"] = main
    try:
        for number, source in enumerate(cells, 1):
            if not source.strip():
                continue  # nbclient does not run an empty cell: no execution count
            history.inputs(source)
            try:
                shown = _run(source, f"<submission cell {number}>", space, compiler)
            except BaseException as err:  # noqa: BLE001 - the kernel goes on to the next cell
                notes.append(f"code cell {number} raised {type(err).__name__}: "
                             f"{str(err)[:200]}")
                continue
            if shown is not None and not _quiet(source):
                history.output(shown)
    finally:
        sys.modules["__main__"] = boot
    return space, notes


class _History:
    """IPython's input and output history in the cells' namespace: ``In``, ``_i``, ``_ii``,
    ``_iii``, ``_iN``; and its display hook's ``Out``, ``_N``, ``_``, ``__``, ``___`` (these
    three left alone once the cells assign one of them themselves, as IPython does)."""

    def __init__(self, space: dict):
        self.space, self.count, self.In, self.Out = space, 0, space["In"], space["Out"]
        self.unders, self.lines = ["", "", ""], ["", "", "", ""]

    def inputs(self, source: str) -> None:
        self.count += 1
        self.In.append(source)
        self.lines = [source, *self.lines[:3]]
        self.space.update(zip(("_i", "_ii", "_iii"), self.lines[1:]))
        self.space[f"_i{self.count}"] = source

    def output(self, value) -> None:
        names = ("_", "__", "___")
        mine = all(self.space.get(n, u) is u for n, u in zip(names, self.unders))
        self.unders = [value, *self.unders[:2]]
        if mine:
            self.space.update(zip(names, self.unders))
        self.space[f"_{self.count}"] = self.Out[self.count] = value


class _Compiler:
    """IPython's compiler: a cell's ``from __future__`` import holds for the later cells too,
    and none of this module's own (``annotations``) leaks into the cells."""

    def __init__(self) -> None:
        self.flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT

    def __call__(self, tree, name: str, mode: str):
        code = compile(tree, name, mode, flags=self.flags, dont_inherit=True)
        self.flags |= code.co_flags & _FUTURES
        return code


_FUTURES = functools.reduce(operator.or_, (getattr(__future__, f).compiler_flag
                                           for f in __future__.all_feature_names))


def _run(source: str, name: str, space: dict, compiler: _Compiler):
    """Runs a cell; the value of its last line if that is an expression (what the kernel
    shows), else None."""
    tree = _parsed(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    _execute(compiler(ast.Module(tree.body, type_ignores=[]), name, "exec"), space)
    return None if last is None else _execute(
        compiler(ast.Expression(last.value), name, "eval"), space)


def _execute(code, space: dict, local: dict | None = None):
    result = eval(code, space, local)  # noqa: S307 - the submission's cell, in the judge's fence
    if code.co_flags & inspect.CO_COROUTINE:  # a top-level await, as ipykernel runs it
        import asyncio
        result = asyncio.run(result)
    return result


def _parsed(source: str) -> ast.Module:
    """A cell as its kernel reads it: plain Python, or IPython's syntax (``%%time``, ``%matplotlib
    inline``) turned into calls of ``get_ipython()`` (:class:`_Magics`), so that a right answer
    under a magic is judged, not refused as a syntax error (round seven: 0 points)."""
    try:
        return ast.parse(source)
    except SyntaxError:
        from IPython.core.inputtransformer2 import TransformerManager
        return ast.parse(TransformerManager().transform_cell(source))


def _quiet(source: str) -> bool:
    """Whether the cell ends with ``;``, which keeps IPython from showing (and keeping) its
    last value."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                    tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)]
    except (tokenize.TokenError, SyntaxError):
        return False
    return bool(tokens) and tokens[-1].string == ";"


class _Magics:
    """The judge's ``get_ipython()``: magics that only time, show or set how things are shown
    run their cell as IPython runs it or do nothing (``obj?`` shows help), ``%env`` sets
    ``os.environ``, ``%%writefile`` writes its file in the judge's folder (for a later cell to
    import, as the kernel's cells import it from theirs) and ``%run FILE`` runs one there; a
    shell line (``!echo``) is not run, and noted (a cell that needs what it did fails on that;
    round 35: a right answer below ``!echo`` or ``%pwd``, or loaded by ``%run``, scored 0); any
    other magic, and a shell command whose output is kept (``x = !ls``), is an error that names
    it."""

    CELL = {"time", "timeit", "capture", "prun"}
    LINE = {"matplotlib", "load_ext", "reload_ext", "unload_ext", "autoreload", "aimport",
            "config", "time", "timeit", "xmode", "precision", "pprint", "colors", "pdb",
            "automagic", "who", "whos", "env", "set_env", "pinfo", "pinfo2", "psearch", "pdoc",
            "pdef", "psource", "pfile"}

    def __init__(self, space: dict, compiler: _Compiler, notes: list[str]):
        self._space, self._compile, self._notes = space, compiler, notes

    def run_cell_magic(self, magic: str, line: str, cell: str):
        if magic in ("writefile", "file"):  # %%file: IPython's other name for it
            return _write_file(self._space, line, cell)
        if magic not in self.CELL:
            raise NameError(f"the judge does not run the cell magic %%{magic}: remove it")
        if magic in ("time", "timeit"):
            return getattr(self, f"_{magic}")(line, cell)
        code = self._compile(_parsed(cell), f"<%%{magic} cell>", "exec")
        if magic == "prun":
            return _execute(code, self._space)
        from IPython.core.magic_arguments import parse_argstring
        from IPython.core.magics.execution import ExecutionMagics
        from IPython.utils.capture import capture_output
        args = parse_argstring(ExecutionMagics.capture, line)
        with capture_output(not args.no_stdout, not args.no_stderr,
                            not args.no_display) as captured:
            _execute(code, self._space)
        if args.output:  # %%capture NAME: the captured output under NAME, as IPython binds it
            self._space[args.output] = captured
        return None

    def run_line_magic(self, magic: str, line: str, *args):
        if magic == "run":
            return _run_file(self._space, self._compile, line)
        if magic == "pwd":
            return os.getcwd()
        if magic not in self.LINE:
            raise NameError(f"the judge does not run the magic %{magic}: remove it")
        if magic in ("time", "timeit"):
            return getattr(self, f"_{magic}")(line, None)
        if magic in ("env", "set_env"):
            return _env(line.strip())
        return None

    def _time(self, line: str, cell: str | None):
        """IPython's ``%time`` / ``%%time``: the code run in the cells' namespace, and the value
        of its last line if that is an expression -- the cell's ``Out``, and ``_`` (round
        thirteen: ``%%time`` gave None, so ``order = _`` below it read the judge's ``""``)."""
        from IPython.core.magic_arguments import parse_argstring
        from IPython.core.magics.execution import ExecutionMagics
        args, extra = parse_argstring(ExecutionMagics.time, line, partial=True)
        if extra and cell:
            raise SyntaxError(f"%%time {' '.join(extra)}: IPython refuses a statement after "
                              f"%%time (UsageError): move it into the cell")
        tree = _parsed(cell or " ".join(extra))
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        try:
            _execute(self._compile(tree, "<timed exec>", "exec"), self._space)
            return None if last is None else _execute(
                self._compile(ast.Expression(last.value), "<timed eval>", "eval"), self._space)
        except Exception:
            if not args.no_raise_error:
                raise
            return None

    def _timeit(self, line: str, cell: str | None) -> None:
        """IPython's ``%timeit`` / ``%%timeit``, its template run once: the setup (the line
        after the options, under ``%%timeit``) and the statement in a function of their own,
        whose names stay local (round thirteen: a ``%%timeit`` cell below the answer that
        assigned ``order`` overwrote it in the judge only)."""
        from IPython.core.magic import Magics
        options, statement = Magics.parse_options(
            types.SimpleNamespace(options_table={}), line, "n:r:tcp:qo", posix=False,
            strict=False, preserve_non_opts=True)
        if "o" in options:
            raise NameError("the judge does not run %timeit -o (its TimingResult): remove -o")
        setup, timed = (_parsed("pass"), _parsed(statement)) if cell is None else (
            _parsed(statement), _parsed(cell))
        for tree, name in ((setup, "<magic-timeit-setup>"), (timed, "<magic-timeit-stmt>")):
            self._compile(tree, name, "exec")  # as IPython: a `return` alone is an error
        inner = ast.parse("def inner(_it, _timer):\n    pass\n    for _i in _it:\n"
                          "        pass\n")
        function = inner.body[0]
        function.body[1].body = timed.body or [ast.Pass()]
        function.body[:1] = setup.body
        ast.fix_missing_locations(inner)
        local: dict = {}
        _execute(self._compile(inner, "<magic-timeit>", "exec"), self._space, local)
        local["inner"](range(1), None)

    def system(self, command: str, *args) -> None:
        self._notes.append(f"the shell line !{command[:40]} was not run: the judge runs no "
                           f"command")

    def getoutput(self, command: str, *args):
        raise NameError(f"the judge does not run shell commands (!{command[:40]}): remove it")


def _env(line: str):
    """IPython's ``%env``: all variables, one (``%env NAME``) or one set (``%env NAME=value``,
    ``%env NAME value``)."""
    if not line:
        return dict(os.environ)
    name, split, value = line.partition("=" if "=" in line else " ")
    if not split:
        return os.environ[name]
    os.environ[name.strip()] = value.strip()
    return None


def _write_file(space: dict, line: str, cell: str) -> None:
    """IPython's ``%%writefile [-a] NAME`` (its own parser; ``{name}`` and ``$name`` read from
    the cells' names): the cell's text into NAME, which must be in the judge's folder -- the
    judge reads no other -- so a path outside it is an error that says how to write it."""
    from IPython.core.magic_arguments import parse_argstring
    from IPython.core.magics.osm import OSMagics

    args = parse_argstring(OSMagics.writefile, _expanded(space, line))
    quoted = re.match(r"^('.*')|(\".*\")$", args.filename)
    name = _inside(args.filename[1:-1] if quoted else args.filename, "%%writefile",
                   "%%writefile my_helpers.py), where a later cell imports it from")
    with open(name, "a" if args.append else "w", encoding="utf-8") as f:
        f.write(cell)


def _run_file(space: dict, compile_: _Compiler, line: str) -> None:
    """IPython's ``%run FILE``, without options or arguments: a file in the judge's folder (as
    a ``%%writefile`` cell wrote it) run as ``__main__`` in a namespace of its own, whose names
    then join the cells', as IPython's do; its code is the submission's, watched as a cell's."""
    import shlex

    words = shlex.split(_expanded(space, line))
    if len(words) != 1 or words[0].startswith("-"):
        raise NameError(f"the judge runs `%run FILE` alone (a Python file in the notebook's "
                        f"folder), not %run {line[:40]}: remove the options and arguments")
    name = _inside(words[0], "%run", "%run my_helpers.py), where %%writefile wrote it")
    if name.endswith(".ipynb"):  # round 40: read as a refused file in the judge's temp folder
        raise NameError(f"the judge runs `%run` on a Python file only, not the notebook {name}: "
                        f"save its code as a .py file (or a %%writefile cell) and %run that")
    if not os.path.isfile(name) and os.path.isfile(name + ".py"):
        name += ".py"  # as IPython's %run finds `helpers` (round 40)
    with open(name, encoding="utf-8") as f:
        tree = _parsed(f.read())
    ran = {"__name__": "__main__", "__file__": name, "__builtins__": builtins}
    _execute(compile_(tree, f"<submission %run {name}>", "exec"), ran)
    space.update({k: v for k, v in ran.items()
                  if not (type(k) is str and k.startswith("__") and k.endswith("__"))})


def _expanded(space: dict, line: str) -> str:
    """A magic's line with ``{name}`` and ``$name`` read from the cells' names, as IPython's."""
    from IPython.utils.text import DollarFormatter

    try:
        return DollarFormatter().vformat(line, args=[], kwargs=space)
    except Exception:  # noqa: BLE001 - as IPython: the line as written
        return line


def _inside(name: str, magic: str, how: str) -> str:
    """``name``, which must be in the judge's folder -- the judge reads no other -- or an error
    that says how to write it."""
    name = os.path.expanduser(name)
    if os.path.isabs(name) or os.path.normpath(name).split(os.sep)[0] == "..":
        raise PermissionError(f"{magic}: the judge reads and writes only a path inside the "
                              f"notebook's folder ({how}), not {name}")
    return name
