"""The interface between a cell and its fast kernels: a **kernel family**.

A kernel family is one class (a subclass of :class:`KernelFamily`) that runs whole
sequences of the cells that declare it.  It says, as class attributes:

* ``name``: the family's name (``lstm_family``, ``gru``, ...);
* ``reads``: the cell attributes it reads — its whole contract with the cell.  The
  family sees a cell only through :meth:`KernelFamily.view`, which holds those attributes
  and nothing else, so a cell keeps every other attribute to itself;
* ``paths``: the kernel paths it may take, members of a :class:`PathEnum` (the built-in
  families' are :class:`KernelPath`'s; a third-party family declares an enum of its own);
* ``native``: its C source, beside the family's module, as :class:`NativeSource`
  (library name, file), if it has native (CPU) loops; ``common/native_build.py`` builds
  what the families declare;
* ``cases``: the (cell, options) the family must be tested on (the test suites
  parametrize over them): every flag set it runs and the options that change its
  arithmetic.

and implements two methods:

* ``choose(v, call) -> path``: the path of one call (after the refusals every family
  shares, :func:`refused`), one of its ``paths`` or ``KernelPath.REFERENCE``; ``v`` is
  the view, ``call`` a :class:`Call`.  Anything else is an error at dispatch
  (:class:`KernelPathError`), so a misspelt or undeclared path never runs;
* ``run(path, v, x, state, lengths, h_mask) -> (outputs, final state)``: ``path`` is one
  of its ``paths`` (checked before the call), and a path it does not know raises
  (:meth:`KernelFamily.unknown`) instead of falling through to another kernel.

Everything else — classifying the mask, the initial state, empty sequences, the
parameters of another dtype or device than the input, the forced reference loop — is
written once here (:meth:`KernelFamily.forward`), and so are ``plan``, ``kernel_name``
(the path as ``lstmablate bench`` shows it) and ``available``.  A family may also run a
whole stacked (bidirectional) encoder in one call (:meth:`KernelFamily.stack`).

A cell declares its family with ``fast_kernels = FastKernels("package.module:NAME", ...)``
(``lstmablate/cells/base.py``); the module is imported on the cell's first run and its
``NAME`` is the family object, registered with :func:`register`.  A third-party cell
declares a family of its own the same way (docs/plugins.md).

This module imports nothing of the kernels, so ``native_build`` and the tests may read
the registry without pulling in any kernel code.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import Tensor

State = tuple[Tensor, ...]
Result = tuple[Tensor, State]

#: the dtypes the CPU kernels (native and PyTorch loops) are written for
CPU_DTYPES = (torch.float32, torch.float64)


class PathEnum(str, Enum):
    """The base of every enum of kernel paths.  A member is a string (its value), so it
    compares equal to, prints as and serialises as its name (``"torch-lstm"``); which
    *member* a family returns is still checked by identity (:meth:`KernelFamily.checked`)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class KernelPath(PathEnum):
    """The paths of the built-in kernel families (each family declares the ones it takes
    in ``paths``).  Adding a path: a member here, the family's ``paths``, a branch in its
    ``run`` and, if ``lstmablate bench`` should say more than its name, in its
    ``describe`` (docs/performance.md, "Adding a kernel family or a path")."""

    #: the cell's own step loop (every family: forced, autocast, masks with holes, dtypes)
    REFERENCE = "reference"
    #: PyTorch's fused kernels (``common/delegate.py``: cuDNN on CUDA, oneDNN / ATen on CPU)
    TORCH_LSTM = "torch-lstm"
    TORCH_RNN = "torch-rnn"
    TORCH_GRU = "torch-gru"
    #: our recurrence with a hand-written BPTT (native loops on CPU, PyTorch loops elsewhere)
    RECURRENT = "recurrent"
    #: nothing reads h_{t-1}: the gates and content for all steps at once, the memory a scan
    SCAN = "scan"
    #: the same on the Triton kernels (CUDA, or CPU tensors under Triton's interpreter)
    TRITON_RECURRENT = "triton-recurrent"
    TRITON_SCAN = "triton-scan"

    @property
    def torch_kind(self) -> str | None:
        """``"lstm"`` / ``"rnn"`` / ``"gru"``: the PyTorch kernel of a ``torch-*`` path."""
        return _TORCH_KINDS.get(self)

    @classmethod
    def torch(cls, kind: str) -> KernelPath:
        """The path of PyTorch's kernel ``kind`` (``"lstm"``, ``"rnn"``, ``"gru"``)."""
        return {k: p for p, k in _TORCH_KINDS.items()}[kind]

    @property
    def on_triton(self) -> KernelPath:
        """The Triton kernels' version of one of our paths (``recurrent``, ``scan``)."""
        return _ON_TRITON[self]

    @property
    def is_triton(self) -> bool:
        """Does the path run the Triton kernels (``triton-*``)?"""
        return self in _ON_TRITON.values()


_TORCH_KINDS = {KernelPath.TORCH_LSTM: "lstm", KernelPath.TORCH_RNN: "rnn",
                KernelPath.TORCH_GRU: "gru"}
_ON_TRITON = {KernelPath.RECURRENT: KernelPath.TRITON_RECURRENT,
              KernelPath.SCAN: KernelPath.TRITON_SCAN}


class KernelPathError(ValueError):
    """A kernel family chose, or was asked to run, a path it does not declare: an error in
    the family's code (no user input names a path), raised at dispatch."""


@dataclass(frozen=True)
class NativeSource:
    """A family's native (C) loops: the library they are built into and its C source, a
    file beside the family's module (families may share a library, e.g. ``factored`` and
    ``multi_matrix``).  The sources every library shares are ``common/la_*``."""

    library: str
    source: str


@dataclass(frozen=True)
class Call:
    """What the dispatch knows about one call: a pure description, so that every path
    choice (the CUDA ones included) is testable on a CPU machine.

    ``mask``: ``"none"``, ``"prefix"`` (variable lengths), ``"prefix0"`` (some length is
    0) or ``"other"`` (holes), as :func:`mask_kind` classifies a mask; ``reference``
    forces (True) or forbids (False) the reference loop, None follows the switches;
    ``native`` / ``triton``: whether the native (C) loops / the Triton kernels run here
    (None: find out); ``batch`` and ``grad`` describe a CPU call for the calibrated
    choice, ``faster`` forces its outcome
    (tests); ``stacked``: the call is a whole encoder's (one cuDNN call).
    """

    device_type: str = "cpu"
    dtype: torch.dtype = torch.float32
    mask: str = "none"
    h_mask: bool = False
    autocast: bool = False
    reference: bool | None = None
    native: bool | None = None
    triton: bool | None = None
    batch: int | None = None
    grad: bool = True
    faster: str | None = None
    stacked: bool = False

    @classmethod
    def of(cls, **call: Any) -> Call:
        known = {f.name for f in fields(cls)}
        unknown = set(call) - known
        if unknown:
            raise TypeError(f"unknown call description(s) {sorted(unknown)}; "
                            f"known: {sorted(known)}")
        return cls(**call)


def refused(call: Call) -> bool:
    """True when no fast path may run the call (the reference loop runs it): forced
    (``switches``), under autocast, a mask with holes, a non-float dtype, and on CPU a
    dtype other than float32 / float64 (what the CPU kernels are written for)."""
    from .switches import reference_forced

    reference = reference_forced() if call.reference is None else call.reference
    if reference or call.autocast or call.mask == "other" or not call.dtype.is_floating_point:
        return True
    return call.device_type == "cpu" and call.dtype not in CPU_DTYPES


def mask_kind(mask: Tensor | None) -> tuple[str, Tensor | None]:
    """Classify a (T, B) mask: ("none", None), ("prefix", lengths), ("prefix0", lengths)
    when some length is 0, or ("other", None) for masks with holes / non-0/1 values."""
    if mask is None:
        return "none", None
    T = mask.shape[0]
    if mask.dim() != 2:
        return "other", None
    if not mask.is_floating_point():
        mask = mask.float()
    lengths = mask.sum(0).round().long()
    steps = torch.arange(T, device=mask.device).unsqueeze(1)
    if not torch.equal((steps < lengths.unsqueeze(0)).to(mask.dtype), mask):
        return "other", None
    if mask.shape[1] and bool((lengths == mask.shape[0]).all()):
        return "none", None
    if mask.shape[1] and bool((lengths == 0).any()):
        return "prefix0", lengths
    return "prefix", lengths


def autocast_on(x: Tensor) -> bool:
    """Is autocast active for x's device (any PyTorch 2.x)?"""
    try:
        return bool(torch.is_autocast_enabled(x.device.type))
    except TypeError:  # PyTorch < 2.4: no device argument
        if x.device.type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


class KernelFamily:
    """The fast kernels of one family of cells (see the module docstring)."""

    name: ClassVar[str]
    reads: ClassVar[tuple[str, ...]]
    paths: ClassVar[tuple[PathEnum, ...]]
    native: ClassVar[NativeSource | None] = None
    cases: ClassVar[tuple[tuple[str, dict], ...]] = ()

    # -- what a family implements ----------------------------------------------------------
    def choose(self, v: SimpleNamespace, call: Call) -> PathEnum:
        """The path of a call no shared rule refused (``v``: the cell's :meth:`view`): one
        of ``paths``, or ``KernelPath.REFERENCE``."""
        raise NotImplementedError

    def run(self, path: PathEnum, v: SimpleNamespace, x: Tensor, state: State,
            lengths: Tensor | None, h_mask: Tensor | None) -> Result:
        """Run a non-empty call (T >= 1) on ``path`` (one of ``paths``); ``lengths`` is None
        or a (B,) tensor on x's device (prefix masks only)."""
        raise NotImplementedError

    def describe(self, path: PathEnum, v: SimpleNamespace, call: Call) -> str:
        """``path`` as ``lstmablate bench`` names it (default: the path itself)."""
        return str(path)

    def stack(self, encoder, x: Tensor, lengths: Tensor | None, state, masks) -> Result | None:
        """The whole encoder in one call, or None (the default: one call per layer and
        direction).  ``x`` is time-major; arguments as ``Encoder.forward``'s."""
        return None

    def stack_plan(self, encoder, **call: Any) -> str | None:
        """The path :meth:`stack` takes for such a call, or None when it declines."""
        return None

    # -- written once ----------------------------------------------------------------------
    def view(self, cell) -> SimpleNamespace:
        """The cell as the family sees it: the attributes in ``reads``, nothing else."""
        return SimpleNamespace(**{a: getattr(cell, a) for a in self.reads})

    def plan(self, cell, **call: Any) -> PathEnum:
        """The path a call of ``cell`` takes: ``KernelPath.REFERENCE`` or one of the
        family's (keyword arguments: the fields of :class:`Call`)."""
        return self._plan(self.view(cell), Call.of(**call))

    def _plan(self, v: SimpleNamespace, call: Call) -> PathEnum:
        return KernelPath.REFERENCE if refused(call) else self.checked(self.choose(v, call))

    def checked(self, path: Any) -> PathEnum:
        """``path`` if it is ``KernelPath.REFERENCE`` or one of the family's ``paths`` (the
        member itself: a string, or another enum's member of the same name, is not), else
        :class:`KernelPathError`."""
        if path is KernelPath.REFERENCE or any(path is p for p in self.paths):
            return path
        raise self.unknown(path)

    def unknown(self, path: Any) -> KernelPathError:
        """The error for a path the family does not declare (its ``run`` raises it for a
        path it has no branch for)."""
        return KernelPathError(
            f"kernel family {self.name!r} ({type(self).__name__}) got the path {path!r}, "
            f"which is not one of its paths ({', '.join(repr(p) for p in self.paths)}) nor "
            "KernelPath.REFERENCE; `choose` must return one of those members")

    def kernel_name(self, cell, **call: Any) -> str:
        c = Call.of(**call)
        v = self.view(cell)
        path = self._plan(v, c)
        return str(path) if path is KernelPath.REFERENCE else self.describe(path, v, c)

    def available(self, cell) -> bool:
        """Would a plain float32 CPU call take a fast path (whatever the switches say)?"""
        return self._plan(self.view(cell), Call(reference=False, native=False,
                                                 faster="native")) is not KernelPath.REFERENCE

    def forward(self, cell, x: Tensor, state: State | None, mask: Tensor | None,
                h_mask: Tensor | None) -> Result | None:
        """The fast path of one call, or None: the caller (``Cell.forward``) then runs the
        reference loop.  Parameters, state or mask of another dtype or device than ``x``
        are not the kernels' business: the reference loop runs (and raises or promotes as
        it always did)."""
        from .switches import reference_forced

        if reference_forced() or x.dim() != 3:
            return None
        kind, lengths = mask_kind(mask)
        v = self.view(cell)
        call = Call(device_type=x.device.type, dtype=x.dtype, mask=kind,
                    h_mask=h_mask is not None, autocast=autocast_on(x), batch=x.shape[1],
                    grad=torch.is_grad_enabled())
        path = self._plan(v, call)
        if path is KernelPath.REFERENCE:
            return None
        T, B = x.shape[0], x.shape[1]
        state = tuple(cell.initial_state(B, x) if state is None else state)
        tensors = [*cell.parameters(), *state] + ([h_mask] if h_mask is not None else [])
        if any(t.dtype != x.dtype or t.device != x.device for t in tensors):
            return None
        if T == 0:
            return x.new_zeros(0, B, cell.output_size), state
        if lengths is not None:
            lengths = lengths.to(x.device)
        return self.run(path, v, x, state, lengths, h_mask)


# ---------------------------------------------------------------------------------------
# the registry: family name -> family
# ---------------------------------------------------------------------------------------

_FAMILIES: dict[str, KernelFamily] = {}


def register(family: KernelFamily) -> KernelFamily:
    """Add a family to the registry (a kernel module does this for its ``KERNELS``)."""
    reads = getattr(family, "reads", None)
    if not getattr(family, "name", None) or not isinstance(reads, tuple):
        raise TypeError(f"{type(family).__name__} must set `name` and `reads` (a tuple)")
    paths = getattr(family, "paths", None)
    if not (isinstance(paths, tuple) and paths and all(isinstance(p, PathEnum) for p in paths)):
        raise TypeError(f"{type(family).__name__} must set `paths`: a non-empty tuple of the "
                        f"members of a PathEnum it may take (got {paths!r})")
    old = _FAMILIES.get(family.name)
    if old is not None and type(old) is not type(family):
        raise ValueError(f"kernel family {family.name!r} is already registered "
                         f"({type(old).__name__})")
    _FAMILIES[family.name] = family
    return family


def families(load: bool = True) -> dict[str, KernelFamily]:
    """Every registered family; ``load``: first import the families every registered cell
    declares (the built-in ones and those of installed plugins)."""
    if load:
        from lstmablate.cells.registry import available_cells, get_cell

        for name in available_cells():
            declared = getattr(get_cell(name).cls, "fast_kernels", None)
            if declared is not None:
                declared.load()
    return dict(_FAMILIES)


def source_path(family: KernelFamily) -> Path:
    """The file of ``family``'s C source: ``native.source`` beside the module of the class
    that declares ``native`` (``second_order/second_order.c`` for ``factored``, which
    inherits it)."""
    owner = next(c for c in type(family).__mro__ if "native" in vars(c))
    return Path(sys.modules[owner.__module__].__file__).resolve().parent / family.native.source


def native_sources(load: bool = True) -> dict[str, Path]:
    """Native library name -> the file of its C source, as the registered families declare
    them (``load``: as :func:`families`)."""
    out: dict[str, Path] = {}
    for fam in families(load).values():
        if fam.native is not None:
            path = source_path(fam)
            known = out.setdefault(fam.native.library, path)
            if known != path:
                raise ValueError(f"native library {fam.native.library!r} is declared with two "
                                 f"sources ({known}, {path})")
    return out


def native_source(library: str) -> Path:
    """The C source of a native library (the families loaded so far, else all of them)."""
    for load in (False, True):
        sources = native_sources(load)
        if library in sources:
            return sources[library]
    raise ValueError(f"unknown native kernel library {library!r}; the kernel families "
                     f"declare {sorted(sources)}")


def family_of(cell) -> KernelFamily | None:
    """The family that runs ``cell``, or None (no fast path declared, or a subclass that
    changed the arithmetic: ``FastKernels.applies_to``)."""
    declared = getattr(type(cell), "fast_kernels", None)
    return declared.load() if declared is not None and declared.applies_to(cell) else None


def plan_of(cell, **call: Any) -> PathEnum:
    """The path a call of any cell takes (``KernelPath.REFERENCE`` without a family)."""
    fam = family_of(cell)
    return KernelPath.REFERENCE if fam is None else fam.plan(cell, **call)


def kernel_name_of(cell, **call: Any) -> str:
    """The path a call of any cell takes, as ``lstmablate bench`` names it."""
    fam = family_of(cell)
    return str(KernelPath.REFERENCE) if fam is None else fam.kernel_name(cell, **call)
