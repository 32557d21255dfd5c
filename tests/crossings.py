"""Counts the crossings between Python and the engine's C++ module over a region of code, with sys.setprofile:

- calls: calls from Python into functions of `hybrid_engine._C` (its functions and the methods of its classes);
- callbacks: calls back into Python from C++ while such a call is in progress (a Python function whose caller is a
  frame that is inside a `_C` call: a hook, a loss, a stage's forward the executor runs).

Calls into torch itself (torch.ops, tensor methods) are not counted: they never leave C++ for Python on their own.
The profile hook sees the calling thread only, which is where the CPU autograd engine and the executor run."""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

MODULE = "hybrid_engine._C"


def _in_module(func) -> bool:
    if getattr(func, "__module__", None) == MODULE:
        return True
    owner = getattr(func, "__self__", None)  # a bound method of a pybind class
    return owner is not None and type(owner).__module__ == MODULE


def _name(func) -> str:
    owner = getattr(func, "__self__", None)
    if owner is not None and type(owner).__module__ == MODULE:
        return f"{type(owner).__name__}.{func.__name__}"
    return func.__name__


@dataclass
class Crossings:
    calls: Counter = field(default_factory=Counter)  # _C function name -> count
    callbacks: Counter = field(default_factory=Counter)  # Python function "file:name" -> count
    _open: dict = field(default_factory=dict)  # id(frame) -> how many _C calls that frame has in progress

    @property
    def total(self) -> int:
        return sum(self.calls.values()) + sum(self.callbacks.values())

    def _profile(self, frame, event, arg) -> None:
        if event == "c_call":
            if _in_module(arg):
                self.calls[_name(arg)] += 1
                self._open[id(frame)] = self._open.get(id(frame), 0) + 1
        elif event in ("c_return", "c_exception"):
            if _in_module(arg):
                left = self._open.pop(id(frame)) - 1
                if left:
                    self._open[id(frame)] = left
        elif event == "call":
            caller = frame.f_back
            if caller is not None and id(caller) in self._open:
                self.callbacks[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1

    def __enter__(self) -> "Crossings":
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)

    def __str__(self) -> str:
        return (f"{self.total} crossings: {sum(self.calls.values())} calls into _C {dict(self.calls)}, "
                f"{sum(self.callbacks.values())} callbacks {dict(self.callbacks)}")
