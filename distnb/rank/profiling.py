"""`torch.profiler` on a rank, for the cells the kernel asks it to profile.

`arm(steps)` (the kernel's call, between cells) hooks the engine's cells: the profiler starts
before the next cell runs and records every cell after it, each cell a **window**, until `steps`
optimizer steps have ended (the window is cut there, the profiler stops after that cell) or the
kernel calls `collect()`, which stops it and returns a `RankProfile`: the profiler's events as
plain spans on this rank's monotonic clock (the clock of its `CollectiveEvent`s).

A rank of an attached job (`distnb.rank.agent`) has no cells: there the notebook asks (`ask`,
from the agent's serving thread) for a profile of the next optimizer steps, which the main
thread starts and stops at step boundaries (`at_step`, the agent's step hook): one window from
the end of the step it was asked in, to the end of the last step profiled, or of the step in
which the notebook asked it to end (`report(end=True)`). `report` hands the profile over once
the profiler has stopped.

While armed, modules' forwards are named in the profile (global forward hooks open a
`record_function("nn.Module: <name>")`, `module_names`), which torch's profiler does not do by
itself; their
backward ops are found by autograd's sequence numbers and named after them too. Nothing
of this runs while nothing is armed. The profiler's clock is mapped onto the monotonic clock by a
marker whose start and end hold a `time.monotonic_ns()` read.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch.autograd.profiler import record_function
from torch.nn import Module
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from distnb.errors import SessionError
from distnb.records.profiling import MOST_STEPS, Profiled, RankProfile, Span, SpanKind

__all__ = [
    "MAX_SPANS",
    "arm",
    "armed",
    "ask",
    "at_step",
    "collect",
    "drop",
    "module_names",
    "report",
]

MAX_SPANS = 100_000  # per rank and profile; the newest are kept
_MARK = "distnb: clock"
_CLOSURE = "distnb: closure"  # an optimizer's closure (forward and backward run inside its step)


class _Armed:
    """One rank's profile in the making: its hooks, its profiler, its windows."""

    def __init__(self, rank: int, steps: int | None, cells: bool = True) -> None:
        self.rank, self.limit, self.steps = rank, steps, 0
        self.profiler: Any = None
        self.windows: list[list[int]] = []
        self.marks: list[int] = []  # monotonic reads inside markers (`_anchor`)
        self.cpu: list[tuple[int, int]] = []  # (monotonic, main thread's CPU) at bounds
        self.runs: list[int] = []
        self.offset_ns, self.precision_ns, self.cost_ns = 0, 0, 0
        self.done = False  # the step limit was reached: no more windows
        self.stopped = False
        self.finished = False  # stopped, its hooks removed: its events can be read (`report`)
        self.modules: list[Any] = []  # open record_functions of modules' forwards
        self.names: WeakKeyDictionary[Any, str] = WeakKeyDictionary()  # module -> its name
        self.shell: Any = None
        self.handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._enter),
            torch.nn.modules.module.register_module_forward_hook(self._exit),
            register_optimizer_step_pre_hook(self._closure),
        ]
        if cells:  # an attached rank's steps come from its agent's step hook (`at_step`)
            from IPython import get_ipython

            self.shell = get_ipython()
            self.handles.append(register_optimizer_step_post_hook(self._stepped))
        if self.shell is not None:
            self.shell.events.register("pre_run_cell", self._pre)
            self.shell.events.register("post_run_cell", self._post)

    # --- cells -----------------------------------------------------------------------------

    def _pre(self, info: Any = None) -> None:
        if self.done:
            return
        if self.profiler is None:
            self._start()
        if self.shell is not None:
            self.runs.append(_run_id())
        self.windows.append([time.monotonic_ns(), 0])
        self._sample()

    def _post(self, result: Any = None) -> None:
        if self.windows and not self.windows[-1][1]:
            self.windows[-1][1] = time.monotonic_ns()
            self._sample()
        self.modules.clear()  # a forward that raised left its record_function open
        if self.done:
            self._stop()

    def _sample(self) -> None:
        self.cpu.append((time.monotonic_ns(), time.thread_time_ns()))

    def _stepped(self, optimizer: Any = None, args: Any = None, kwargs: Any = None) -> None:
        self.steps += 1
        if not self.done:
            self._sample()
        if self.steps >= (MOST_STEPS if self.limit is None else self.limit):
            self._last_step()

    def _last_step(self) -> None:
        """No more windows; this one ends here. In a cell the profiler stops after the cell,
        not inside the step's record."""
        self.done = True
        if self.windows and not self.windows[-1][1]:
            self.windows[-1][1] = time.monotonic_ns()

    # --- modules ---------------------------------------------------------------------------

    def _enter(self, module: Any, args: Any) -> None:
        if self.profiler is not None and not self.done:
            name = self.names.get(module)
            if name is None:
                if not self.modules:  # an outermost module: its tree is named from it
                    self.names.update(module_names(module))
                name = self.names.get(module) or type(module).__name__
            rf = record_function(f"nn.Module: {name}")
            rf.__enter__()  # type: ignore[no-untyped-call]
            self.modules.append(rf)

    def _exit(self, module: Any, args: Any, output: Any) -> None:
        if self.modules:
            self.modules.pop().__exit__(None, None, None)

    def _closure(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """A closure given to the optimizer's step (Lightning's training step, LBFGS's loss)
        runs inside a marker, so that the step's own time is told from the forward and
        backward its closure runs (`_spans`)."""
        if self.profiler is None or self.done:
            return None
        if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer
            return (args[0], _marked(args[1]), *args[2:]), kwargs
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": _marked(kwargs["closure"])}
        return None

    # --- the profiler ----------------------------------------------------------------------

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        began = time.monotonic_ns()
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(activities=activities)
        with _quiet():
            self.profiler.start()
        self.marks = [_mark() for _ in range(3)]  # the first is slow (the profiler warms up)
        self.cost_ns += time.monotonic_ns() - began

    def _stop(self) -> None:
        if self.profiler is not None and not self.stopped:
            self.stopped = True  # a second stop() would start a profile of nothing over it
            began = time.monotonic_ns()
            with _quiet():
                self.profiler.stop()
            self.cost_ns += time.monotonic_ns() - began

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        if self.shell is not None:
            for event, hook in (("pre_run_cell", self._pre), ("post_run_cell", self._post)):
                with contextlib.suppress(ValueError):
                    self.shell.events.unregister(event, hook)

    def profile(self) -> RankProfile:
        self._stop()
        began = time.monotonic_ns()
        windows = tuple((a, b or a) for a, b in self.windows)
        spans: list[Span] = []
        dropped = precision = 0
        if self.profiler is not None:
            spans, dropped, precision = _spans(_events(self.profiler), self.marks, windows)
        return RankProfile(
            rank=self.rank,
            spans=tuple(spans),
            windows=windows,
            runs=tuple(self.runs),
            steps_limit=self.limit,
            clock_precision_ns=precision,
            dropped=dropped,
            cost_ns=self.cost_ns + time.monotonic_ns() - began,
            cpu=tuple(self.cpu),
        )


_armed: _Armed | None = None


def arm(steps: int | None = None) -> None:
    """Profile this rank's next cells, until `steps` optimizer steps (or `collect`)."""
    global _armed
    import torch.distributed as dist

    if _armed is not None:
        _armed.remove()
        _armed._stop()
    _armed = _Armed(dist.get_rank() if dist.is_initialized() else 0, steps)


def armed() -> bool:
    return _armed is not None


def collect() -> RankProfile | None:
    """Stop profiling; what was recorded since `arm` (None if nothing was armed)."""
    global _armed
    state, _armed = _armed, None
    if state is None:
        return None
    state.remove()
    return state.profile()


# --- an attached job's rank: steps, not cells ------------------------------------------------

_steps: _Armed | None = None  # made, started and stopped on the main thread, at steps
_asked: list[int | None] = []  # a profile asked for (its step count), begun at the next step
_end = False  # the notebook asked the profile under way to end at the next step
_drop = False  # ... and to be dropped (the notebook detached)


def ask(steps: int | None) -> None:
    """(The agent's serving thread) profile this rank's optimizer steps from the end of its next
    one: `steps` of them, or until `report(end=True)`. A profile under way is dropped."""
    global _end, _drop
    if steps is not None and steps < 1:
        raise ValueError(f"steps is how many optimizer steps to profile, 1 or more; got {steps}")
    _end = _drop = False
    _asked[:] = [steps]


def drop() -> None:
    """(The serving thread) forget a profile asked or under way; it stops at the next step."""
    global _steps, _end, _drop
    _asked.clear()
    if _steps is not None and _steps.finished:
        _steps = None
    elif _steps is not None:
        _end = _drop = True


def at_step(rank: int) -> None:
    """(The main thread, after each optimizer step) count the step for the profile under way,
    stop it at its last step, start the one asked for."""
    global _steps, _end, _drop
    job = _steps
    if job is not None and not job.stopped:
        job._stepped()
        if (_end or _asked) and not job.done:
            job._last_step()
        if job.done:  # inside the step's record: its profiler event ends here
            job.remove()
            job._stop()
            job.finished, _end = True, False
        if _drop:
            _steps, _drop = None, False
    if _asked:
        _steps = _Armed(rank, _asked.pop(), cells=False)
        _steps._pre()


def report(end: bool = False) -> Profiled:
    """(The serving thread) how the profile stands, with the profile once it has stopped
    (handed over once); `end`: end a profile asked without a step count at the next step."""
    global _steps, _end
    job = _steps
    if job is None or _drop:  # dropped: gone to the notebook now, to the rank at its next step
        return Profiled(asked=bool(_asked), steps=0, limit=_asked[0] if _asked else None)
    if not job.finished:
        _end = _end or (end and job.limit is None)
        return Profiled(asked=True, steps=job.steps, limit=job.limit)
    _steps = None
    return Profiled(asked=True, steps=job.steps, limit=job.limit, profile=job.profile())


# --- events to spans -----------------------------------------------------------------------


# Wrappers around the user's model, and the attribute each keeps it in: DDP, DataParallel and
# FSDP (`module`), Lightning's strategy wrapper (`_forward_module`), torch.compile (`_orig_mod`)
_WRAPPED = ("module", "_forward_module", "_orig_mod")


def module_names(root: Any) -> dict[Any, str]:
    """Each module under `root` named by its path from the model the wrappers around it keep
    (`Model.net.0 (Linear)`; the model itself `Model`, a wrapper by its class): two layers of
    one class are told apart."""
    names: dict[Any, str] = {}
    model = root
    while True:
        names[model] = type(model).__name__
        inner = next((a for a in _WRAPPED if isinstance(getattr(model, a, None), Module)), None)
        if inner is None:
            break
        model = getattr(model, inner)
    base = type(model).__name__
    for path, sub in model.named_modules(remove_duplicate=True):
        if path:
            names.setdefault(sub, f"{base}.{path} ({type(sub).__name__})")
    return names


def _marked(closure: Any) -> Any:
    def marked(*args: Any, **kwargs: Any) -> Any:
        with record_function(_CLOSURE):
            return closure(*args, **kwargs)

    return marked


def _mark() -> int:
    """A monotonic read inside a marker of the profile."""
    with record_function(_MARK):
        return time.monotonic_ns()


def _run_id() -> int:
    """The run the kernel posted for this cell (`0` outside a session)."""
    from distnb.contract import keys
    from distnb.rank import runtime

    try:
        return keys.decode_run(runtime.control_store().get(keys.RUN))[1]
    except (SessionError, RuntimeError):  # not a session's rank (a test, a script)
        return 0


# An event as read from kineto's results: (name, start, end, thread, on a device, autograd
# sequence number, the forward's thread for a backward op or 0), in the profiler's ns; reading
# them so takes a few ms where `profile.events()` (a Python tree of FunctionEvents) takes
# 100-400 ms for the same profile.
_Event = tuple[str, int, int, int, bool, int, int]
_BACKWARD = "autograd::engine::evaluate_function: "


def _events(profiler: Any) -> list[_Event]:
    from torch._C._autograd import DeviceType

    cpu = DeviceType.CPU
    return [
        (
            e.name(),
            e.start_ns(),
            e.end_ns(),
            e.start_thread_id(),
            e.device_type() != cpu,
            e.sequence_nr(),
            e.fwd_thread_id(),
        )
        for e in profiler.profiler.kineto_results.events()
    ]


def _anchor(events: list[_Event], marks: list[int]) -> tuple[int, int]:
    """(offset from the profiler's ns to monotonic ns, precision ns): the tightest marker."""
    found = sorted((e for e in events if e[0] == _MARK), key=lambda e: e[1])
    best = (0, 0)
    for (_, start, end, *_), read in zip(found, marks, strict=False):
        half = (end - start + 1) // 2
        if best == (0, 0) or half < best[1]:
            best = (read - (start + end) // 2, half)
    return best


def _kind(name: str, device: bool) -> SpanKind:
    if device:
        return SpanKind.DEVICE
    if name.startswith("nn.Module: "):
        return SpanKind.MODULE
    if name.startswith("enumerate(DataLoader)"):
        return SpanKind.DATA
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return SpanKind.OPTIMIZER
    if name.startswith(("c10d::", "gloo:", "nccl:", "record_param_comms")):
        return SpanKind.COMM
    return SpanKind.OP


def _named(name: str) -> bool:
    """An op inside a module's forward is kept (it says what the module spent its time on), as
    is one inside an optimizer's closure (the user's step: forward, loss, backward); one inside
    any other op is its detail."""
    return name.startswith("nn.Module: ") or name == _CLOSURE


def _spans(
    events: list[_Event], marks: list[int], windows: tuple[tuple[int, int], ...]
) -> tuple[list[Span], int, int]:
    """Outermost ops (and ops right inside a module's forward), every labelled span and every
    backend op, that start inside the windows, on the monotonic clock. A CPU event's parent is
    the innermost event of its thread still open at its start. A backward op whose forward ran
    inside a module (autograd's sequence number links them) is also a span of that module,
    `nn.Module: <class> (backward)`, so that a module's time is its forward and its backward.
    An optimizer step that ran a closure (`_Armed._closure`) is its time after the closure: the
    forward and backward inside it are the closure's spans, not the optimizer's."""
    offset, precision = _anchor(events, marks)
    out: list[Span] = []
    # thread -> (end, name, innermost module) of the events open at this point
    open_: dict[int, list[tuple[int, str, str]]] = {}
    forward: dict[tuple[int, int], str] = {}  # (thread, sequence number) -> its module
    closures: list[tuple[int, int, int]] = []  # (thread, start, end) of optimizers' closures
    for name, start, end, thread, device, seq, fwd in sorted(events, key=lambda e: (e[1], -e[2])):
        stack = open_.setdefault(thread, [])
        while stack and not device and stack[-1][0] <= start:
            stack.pop()
        parent, module = (stack[-1][1], stack[-1][2]) if stack and not device else (None, "")
        if name.startswith("nn.Module: "):
            module = name.removeprefix("nn.Module: ")
        if not device:
            stack.append((end, name, module))
        if seq >= 0 and not fwd and module:
            forward.setdefault((thread, seq), module)
        if name == _CLOSURE:
            closures.append((thread, start + offset, end + offset))
        if name in (_MARK, _CLOSURE) or not any(a <= start + offset <= b for a, b in windows):
            continue  # a step limit cuts a window inside a step: a span that starts in counts
        kind = _kind(name, device)
        if kind is SpanKind.OP and parent is not None and not _named(parent):
            continue
        out.append(Span(name, kind, start + offset, end + offset, thread))
        owner = forward.get((fwd, seq)) if fwd and name.startswith(_BACKWARD) else None
        if owner is not None:
            owner = f"nn.Module: {owner} (backward)"
            out.append(Span(owner, SpanKind.MODULE, start + offset, end + offset, thread))
    if closures:
        out = [_after_closures(s, closures) for s in out]
    dropped = max(0, len(out) - MAX_SPANS)
    return out[dropped:], dropped, precision


def _after_closures(span: Span, closures: list[tuple[int, int, int]]) -> Span:
    """An optimizer step's span from the end of the closures it ran (itself if none)."""
    if span.kind is not SpanKind.OPTIMIZER:
        return span
    ends = [b for t, a, b in closures if t == span.thread and span.start_ns <= a <= span.end_ns]
    return replace(span, start_ns=max(ends)) if ends else span


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Kineto writes a line to fd 2 as it starts and stops ("USDT: ... profiler_start"), which a
    rank would show as the cell's stderr: point fd 2 elsewhere meanwhile."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
