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
  shares, ``call.refused``), one of its ``paths`` or ``KernelPath.REFERENCE``; ``v`` is
  the view, ``call`` a ``Call`` (``call.py``: what the dispatch knows about one call, and
  the rules every family shares around its choice).  Anything else is an error at dispatch
  (:class:`KernelPathError`), so a misspelt or undeclared path never runs;
* ``run(path, v, x, state, lengths, h_mask) -> (outputs, final state)``: ``path`` is one
  of its ``paths`` (checked before the call), and a path it does not know raises
  (:meth:`KernelFamily.unknown`) instead of falling through to another kernel.

Everything else — classifying the mask, the initial state, empty sequences, the
parameters of another dtype or device than the input, the forced reference loop, autocast
(mixed precision), a GPU path that fails, the record of the paths taken — is written once
here (:meth:`KernelFamily.forward`), and so are ``plan``, ``kernel_name`` (the path as
``lstmablate bench`` shows it) and ``available``.  A family may also run a whole stacked
(bidirectional) encoder in one call (:meth:`KernelFamily.stack`).

**Under autocast** (``torch.autocast``, what ``train.precision: bf16 | fp16`` turns on) a
call is described with the autocast dtype (:func:`autocast_dtype`) and runs a fast path only
where that path has a low-precision kernel (``call.runs_low_precision``): the Triton kernels
(which carry the memory cell and its gradient in float32) and, on CUDA, PyTorch's cuDNN
kernels; the input, h and the parameters are cast to the autocast dtype (differentiably:
the gradients reach the float32 parameters) and the kernel runs with autocast off (a family
with ``autocast_inside``, the linear scan, takes the call as it is: its matrix products and
element-wise work are the cell's own PyTorch operations, which autocast as in the reference
loop, and its kernel carries the memory in float32).  Every
other path (the native loops, the PyTorch loops, a third-party family's) leaves the call to
the reference loop, which runs under autocast as any PyTorch code does.

**A GPU path that fails** (:func:`guarded`: the Triton kernels, and cuDNN under autocast):
any exception from compiling, loading or launching it (or capturing its CUDA graph) — a
missing C compiler or ``Python.h`` for Triton's launcher, a driver error — makes the family
fall back to its next correct path for the rest of the process (Triton: cuDNN where the
cell has one, else the PyTorch loops; cuDNN under autocast: the reference loop), with one
warning naming the kernel, the error's first line and ``LSTMABLATE_TRITON=0``
(:func:`report_failure`).  The forward is re-run on that path; a failure inside a Triton
backward is recomputed through the PyTorch function of the same inputs and gradients
(``common/guard.py``).  Out-of-memory errors are not recovered: another path needs memory
too, and the trainer names them.  A wrong *result* is no exception: ``make gpu-check``
compares every fast path with the reference loop on the GPU.

**What ran** (:func:`kernel_record`): every call's path is counted per cell, and every
fallback is listed; a run writes it to its ``env.json`` (``lstmablate/run/runner.py``).

A cell declares its family with ``fast_kernels = FastKernels("package.module:NAME", ...)``
(``lstmablate/cells/base.py``); the module is imported on the cell's first run and its
``NAME`` is the family object, registered with :func:`register`.  A third-party cell
declares a family of its own the same way (docs/plugins.md).

This module imports nothing of the kernels (``call.py`` and ``switches.py`` only), so
``native_build`` and the tests may read the registry without pulling in any kernel code.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import Tensor

from .call import Call, mask_kind, refused, runs_low_precision

State = tuple[Tensor, ...]
Result = tuple[Tensor, State]


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
    ``describe`` (docs/design/adding-a-kernel-family.md)."""

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


# -- under autocast: the dtype a call runs in, the view cast to it ---------------------------
def autocast_on(x: Tensor) -> bool:
    """Is autocast active for x's device (any PyTorch 2.x)?"""
    try:
        return bool(torch.is_autocast_enabled(x.device.type))
    except TypeError:  # PyTorch < 2.4: no device argument
        if x.device.type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def autocast_dtype(x: Tensor) -> torch.dtype | None:
    """The dtype autocast runs x's device's products in (float16, bfloat16), or None when
    autocast is off there."""
    if not autocast_on(x):
        return None
    get = getattr(torch, "get_autocast_dtype", None)
    if get is not None:
        return get(x.device.type)
    return torch.get_autocast_cpu_dtype() if x.device.type == "cpu" else \
        torch.get_autocast_gpu_dtype()  # PyTorch < 2.4


def lowered(v: SimpleNamespace, dtype: torch.dtype) -> SimpleNamespace:
    """A cell's view with every floating tensor (also in a list, e.g. a ParameterList)
    cast to ``dtype``; differentiable, so the gradients reach the cell's own parameters."""
    def cast(a: Any) -> Any:
        if isinstance(a, Tensor):
            return a.to(dtype) if a.is_floating_point() else a
        if isinstance(a, (list, tuple, torch.nn.ParameterList)):
            return [cast(t) for t in a]
        return a
    return SimpleNamespace(**{k: cast(a) for k, a in vars(v).items()})


class KernelFamily:
    """The fast kernels of one family of cells (see the module docstring)."""

    name: ClassVar[str]
    reads: ClassVar[tuple[str, ...]]
    paths: ClassVar[tuple[PathEnum, ...]]
    native: ClassVar[NativeSource | None] = None
    cases: ClassVar[tuple[tuple[str, dict], ...]] = ()
    #: True for a family whose ``run`` works under autocast as it is: its PyTorch operations
    #: autocast as the reference loop's do and its kernel carries the memory in float32
    #: (``linear_scan/``); :meth:`forward` then passes such a call on without the casts
    autocast_inside: ClassVar[bool] = False

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
        """The family's choice after the shared refusals, past the paths that failed in this
        process (:func:`report_failure`: Triton's next choice is made as if Triton did not
        run here; any other failed path leaves the call to the reference loop) and, under
        autocast, only a path with a low-precision kernel."""
        if refused(call):
            return KernelPath.REFERENCE
        path = self.checked(self.choose(v, call))
        if getattr(path, "is_triton", False) and has_failed(self.name, path):
            path = self.checked(self.choose(v, replace(call, triton=False)))
        if has_failed(self.name, path) or (call.autocast and not runs_low_precision(path, call)):
            return KernelPath.REFERENCE
        return path

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
        it always did); under autocast every floating tensor on x's device will do (they
        are cast, see the module docstring)."""
        from .switches import reference_forced

        if reference_forced() or x.dim() != 3:
            note_path(cell, KernelPath.REFERENCE)
            return None
        kind, lengths = mask_kind(mask)
        v = self.view(cell)
        low = autocast_dtype(x)
        call = Call(device_type=x.device.type, dtype=low or x.dtype, mask=kind,
                    h_mask=h_mask is not None, autocast=low is not None, batch=x.shape[1],
                    grad=torch.is_grad_enabled())
        path = self._plan(v, call)
        if path is KernelPath.REFERENCE:
            note_path(cell, path)
            return None
        T, B = x.shape[0], x.shape[1]
        state = tuple(cell.initial_state(B, x) if state is None else state)
        tensors = [*cell.parameters(), *state] + ([h_mask] if h_mask is not None else [])
        if not all(t.device == x.device and (t.is_floating_point() if low else t.dtype == x.dtype)
                   for t in tensors):
            note_path(cell, KernelPath.REFERENCE)
            return None
        if T == 0:
            return x.new_zeros(0, B, cell.output_size), state
        if lengths is not None:
            lengths = lengths.to(x.device)
        if low is None or self.autocast_inside:
            return self._run(cell, path, v, call, x, state, lengths, h_mask)
        # autocast: the input, h and the parameters in the low precision (the other states,
        # e.g. the memory cell, as they are: the kernels keep c in float32), autocast off
        # inside (every operand already has its dtype)
        state = (state[0].to(low), *state[1:])
        h_mask = h_mask.to(low) if h_mask is not None else None
        with torch.autocast(x.device.type, enabled=False):
            return self._run(cell, path, lowered(v, low), call, x.to(low), state, lengths,
                             h_mask)

    def _run(self, cell, path: PathEnum, v: SimpleNamespace, call: Call, x: Tensor,
             state: State, lengths: Tensor | None, h_mask: Tensor | None) -> Result | None:
        """Run ``path``; when a guarded path fails (:func:`guarded`), report it and run the
        family's next path (None: the reference loop)."""
        if not guarded(path, call):
            note_path(cell, path)
            return self.run(path, v, x, state, lengths, h_mask)
        try:
            result = self.run(path, v, x, state, lengths, h_mask)
        except Exception as err:  # noqa: BLE001  (any failure of a GPU path: see the module doc)
            if not recoverable(err):
                raise
            report_failure(self.name, path, err)
            nxt = self._plan(v, call)
            if nxt is KernelPath.REFERENCE:
                note_path(cell, nxt)
                return None
            return self._run(cell, nxt, v, call, x, state, lengths, h_mask)
        note_path(cell, path)
        return result


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


# ---------------------------------------------------------------------------------------
# a path that fails, and what ran: the paths taken, the paths that failed
# ---------------------------------------------------------------------------------------

def guarded(path: Any, call: Call) -> bool:
    """Is ``path`` one whose failure falls back instead of ending the process: the Triton
    kernels (compiled at first use on the user's GPU) and cuDNN under autocast?"""
    return getattr(path, "is_triton", False) or (call.autocast and runs_low_precision(path, call))


def recoverable(err: BaseException) -> bool:
    """May a failure of a guarded path fall back?  Any exception but a programming error of
    the dispatch (:class:`KernelPathError`) and running out of memory (another path needs
    memory as well; the trainer names the shape that did not fit)."""
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(err, Exception) and not isinstance(err, (KernelPathError, oom))



#: (cell, path) -> calls since the last :func:`reset_kernel_record`
_TAKEN: dict[tuple[str, str], int] = {}
#: family name -> the failed paths' kinds ("triton" for any Triton path, else the path)
_FAILED: dict[str, set[str]] = {}
#: every failure of this process, in order (what :func:`kernel_record` lists)
_FAILURES: list[dict[str, str]] = []


class KernelFailure(RuntimeError):
    """A kernel's launch (its compilation included) raised: names the kernel, so that the
    fallback's warning can (``common/triton_common.launch`` raises it)."""

    def __init__(self, kernel: str, err: BaseException):
        super().__init__(f"{type(err).__name__}: {first_line(err)}")
        self.kernel, self.error = kernel, err


def first_line(err: BaseException) -> str:
    """The first non-empty line of an error's message (Triton's compile errors quote whole
    kernels after it)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def cell_label(cell) -> str:
    """The registered name a cell was built under (``CellSpec.build``), else its class."""
    return getattr(cell, "cell_name", None) or type(cell).__name__


def note_path(cell, path: Any) -> None:
    """Count one call of ``cell`` on ``path`` (:func:`kernel_record`)."""
    key = (cell_label(cell), str(path))
    _TAKEN[key] = _TAKEN.get(key, 0) + 1


def _failure_kind(path: Any) -> str:
    return "triton" if getattr(path, "is_triton", False) else str(path)


def has_failed(family: str, path: Any) -> bool:
    """Did ``path`` (any Triton path, for a Triton one) of ``family`` fail in this process?"""
    failed = _FAILED.get(family)
    return bool(failed) and _failure_kind(path) in failed


def report_failure(family: str, path: Any, err: BaseException) -> None:
    """Record that ``path`` of ``family`` failed with ``err`` (every later plan of the family
    passes it by: :meth:`KernelFamily._plan`) and warn, once per family and kind of path,
    naming the kernel, the error's first line and the switch that avoids it."""
    kind = _failure_kind(path)
    if has_failed(family, path):
        return
    _FAILED.setdefault(family, set()).add(kind)
    kernel = err.kernel if isinstance(err, KernelFailure) else f"{path} ({family})"
    cause = err.error if isinstance(err, KernelFailure) else err
    message = f"{type(cause).__name__}: {first_line(cause)}"
    note_fallback(family, str(path), kernel, message)
    if kind == "triton":
        then = ("cuDNN where the cell has a cuDNN kernel, else the PyTorch loops (the same "
                "numbers)")
        advice = ("set LSTMABLATE_TRITON=0 to run without the Triton kernels from the start "
                  "(Triton builds its launcher with the host's C compiler and needs Python.h: "
                  "docs/design/gpu.md, \"When a GPU kernel fails\")")
    else:
        then = "the reference loop (under autocast)"
        advice = ("LSTMABLATE_TRITON=0 does not avoid this one; train.precision: fp32 does "
                  "(docs/design/gpu.md, \"When a GPU kernel fails\")")
    warnings.warn(f"the kernel {kernel} of the {family} cells failed ({message}); for the rest "
                  f"of this process they run {then}. To avoid it, {advice}.", RuntimeWarning,
                  stacklevel=2)


def note_fallback(family: str, path: str, kernel: str, error: str) -> None:
    """List one fallback in :func:`kernel_record` (``common/graphs.py`` lists a failed
    capture this way: its loops run eagerly, the family keeps its path)."""
    _FAILURES.append({"family": family, "path": path, "kernel": kernel, "error": error})


def kernel_record() -> dict[str, Any]:
    """What the fast paths did: ``paths``, per cell (its registered name) the calls per path
    since the last :func:`reset_kernel_record`; ``fallbacks``, every path that failed in
    this process (family, path, kernel, error), in order.  A run writes it to ``env.json``;
    ``make gpu-check`` may show it per cell."""
    cells: dict[str, dict[str, int]] = {}
    for (label, path), n in sorted(_TAKEN.items()):
        cells.setdefault(label, {})[path] = n
    return {"paths": cells, "fallbacks": [dict(f) for f in _FAILURES]}


def reset_kernel_record() -> None:
    """Start counting the paths taken afresh (a run does at its start); the failures stay:
    a family that fell back stays so for the rest of the process."""
    _TAKEN.clear()


def forget_failures() -> None:
    """Forget every failure (the families try their Triton kernels again): for tests, and
    for a long-lived process after the cause was fixed."""
    _FAILED.clear()
    _FAILURES.clear()
