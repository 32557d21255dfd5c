"""Test tiers: a test that starts processes (gloo ranks through dist_utils.run_ranks, the driver under torchrun
or by hand, an experiment script's driver runs, a compiler) is marked `multiprocess`; the few in-process tests
that take tens of seconds carry `slow` in their file; everything else runs in this process in well under a minute:

    python -m pytest -q -m "not multiprocess and not slow"     # the fast tier
    python -m pytest -q                                        # everything (CI)

The mark is found, not written into each file: a test is `multiprocess` when its function, a fixture it uses, or
a helper of its module they call (followed through the module's own functions) names one of SPAWNERS.

The suite runs on two pytest-xdist workers (pyproject.toml's addopts; `-n 0` runs it in this process), one per
core of CI's machine: a third filled some waits on one 2-core machine (838 s against 1,016) and lost on CI's own
(1,049 s for the whole CI run against 847 with two). A file's tests run on one worker (--dist loadfile), so a
module-scoped fixture (runs that several tests check) is computed once. Every test finds its own ports
(launch_utils.free_port, or the OS's for an in-process store) and writes under its own tmp_path: two never collide.

Inductor compiles on one thread in every process the tests start (TORCHINDUCTOR_COMPILE_THREADS=1): by default it
starts a pool of compile workers per compiling process, seconds of start-up that two busy cores never win back.
"""
from __future__ import annotations

import inspect
import os
import sys
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ mirrors the package (tests/parallel/ for hybrid_engine/parallel/, ...). Test files import the helpers
# here (engine_reference, launch_utils, ...), and ranks started by dist_utils.run_ranks import a test module by its
# name: pytest's default import mode puts only a test file's own folder on sys.path, and the ranks' forkserver keeps
# the sys.path it started with. So every test folder is on sys.path from the start of the session.
_TESTS = os.path.join(REPO, "tests")
for _folder in [_TESTS] + sorted(os.path.join(_TESTS, d) for d in os.listdir(_TESTS)
                                 if os.path.isdir(os.path.join(_TESTS, d)) and not d.startswith(("_", "."))):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)
SPAWNERS = {"run_ranks", "torchrun", "subprocess", "Popen", "_plain_ranks"}
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # before anything imports inductor; children inherit it


def _names(code: types.CodeType) -> set[str]:
    """Every global/attribute name a function's code (and the functions nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _ours(obj) -> bool:
    """A function or module of this repository (tests/, experiments/, hybrid_engine/), not of a library."""
    path = getattr(obj, "__file__", None) or getattr(getattr(obj, "__code__", None), "co_filename", "")
    return bool(path) and path.startswith(REPO) and "site-packages" not in path


def _spawns(func, seen: set[int]) -> bool:
    """Whether `func`, or a function of ours it names (a module global, or `module.attr` of a module of ours such
    as experiments/bench/bench.py's main), names a spawner."""
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or id(code) in seen or not _ours(func):
        return False
    seen.add(id(code))
    names = _names(code)
    if names & SPAWNERS:
        return True
    scope = getattr(func, "__globals__", {})
    called = [scope[n] for n in names if isinstance(scope.get(n), types.FunctionType)]
    for module in (scope[n] for n in names if isinstance(scope.get(n), types.ModuleType) and _ours(scope[n])):
        called += [getattr(module, n) for n in names if isinstance(getattr(module, n, None), types.FunctionType)]
    return any(_spawns(f, seen) for f in called)


def pytest_collection_modifyitems(config, items):
    slow_files = set()
    for item in items:
        funcs = [getattr(item, "function", None)]
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures is not None:
            for name in fixtures.names_closure:
                for fixturedef in fixtures.name2fixturedefs.get(name, ()):
                    funcs.append(fixturedef.func)
        seen: set[int] = set()
        if any(f is not None and _spawns(f, seen) for f in funcs):
            item.add_marker(pytest.mark.multiprocess)
        if item.get_closest_marker("multiprocess") or item.get_closest_marker("slow"):
            slow_files.add(item.nodeid.split("::")[0])
    # Files with slow tests first, each file's tests still together and in order: under xdist the in-process
    # files then fill the workers' last minutes instead of one worker ending on a long multi-process file.
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)


@pytest.fixture
def one_thread():
    """One intra-op thread for tests of tiny shapes: on a shared machine two spinning threads cost 10x."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
