"""The watch: hooks on a model (`hooks`) and the step's end, where the step is read back;
`watch(model, ...)` starts one from keyword options.

A step ends at the root module's next forward (`step_on="forward"`) or at `Watch.step()`: then
the step's statistics come back from the device in one read per device (`StepBuffer.read`),
`auto` learns which statistics each frame needs from the next step on, the frames go to the
watch's `History`, and a non-finite value (`stop_on_nonfinite`) or `abort_after` stops the
watch with `NonFiniteError`/`OverflowStop`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from distnb.errors import ConfigError, NonFiniteError, OverflowStop
from distnb.rank.overflow.frames import History
from distnb.rank.overflow.hooks import Hooks
from distnb.rank.overflow.stats import Scratch
from distnb.records.overflow import Phase, RankOverflowReport, Stats, StepOn, WatchOptions

__all__ = ["Watch", "watch"]

_DEFAULT = WatchOptions()


class Watch(Hooks):
    """A running overflow watch over one model on this rank; `distnb.overflow.watch()` makes one.

    Example::

        w = watch(model)
        for batch in loader:
            loss = model(batch).loss
            loss.backward()
            opt.step(); opt.zero_grad()
        w.report().first      # the first non-finite frame, or None
        w.detach()            # every hook gone: the model runs at its own speed again
    """

    def __init__(self, model: nn.Module, options: WatchOptions | None = None) -> None:
        o = (options or WatchOptions()).validated()
        super().__init__(model, o)
        self.rank = o.rank if o.rank is not None else _process_rank()
        self.readbacks = 0  # host syncs made by this watch: one per step and device
        self._step = self._order = 0  # _order: frames read back mid-step
        self._history = History(self.rank, o)
        self._stopped = ""
        self._attach(self._on_root_forward)

    # -- public ----------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def buffer_bytes(self) -> int:
        """Device memory this watch keeps between steps: a few scalars per tensor of a step (and,
        under `auto`/`full` on CPU, scratch space for the statistics). It keeps no tensor of the
        model alive: the hooks compute as tensors pass and hold only weak references."""
        return self._buf.nbytes

    def step(self) -> None:
        """End the current step: read its statistics back (one host sync per device).

        With `step_on="explicit"` this is the only place steps end, and every forward of the
        root module in between is a micro-step. It raises `NonFiniteError`/`OverflowStop` when
        the watch was asked to stop.
        """
        if self._handles:
            self._end_step()

    def report(self) -> RankOverflowReport:
        """What this watch saw so far, as a plain record; reads back what is still pending."""
        if self._metas:
            self._readback()  # a stop it asks for is left to the step's end
        h = self._history
        return RankOverflowReport(
            rank=self.rank,
            steps=self._step,
            readbacks=self.readbacks,
            first=h.first,
            ring=h.ring or h.tail(),
            traced=tuple(h.traced),
            headroom=tuple(h.headroom),
            stopped=self._stopped,
            stats=self.options.stats,
        )

    def detach(self) -> None:
        """Remove every hook this watch installed; the report stays readable.

        Hooks already placed on a live autograd graph stay there until the graph is freed, and
        do nothing.
        """
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._buf.scratch = Scratch()  # frees the buffers

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        first = self._history.first
        where = f", first non-finite at {first.where}" if first else ""
        return (
            f"<Watch rank {self.rank} {state}: {self._step} steps, "
            f"{self.readbacks} readbacks{where}>"
        )

    # -- step end ----------------------------------------------------------------------------

    def _on_root_forward(self, module: nn.Module, args: Any) -> None:
        if self.options.step_on is StepOn.FORWARD:
            if self._metas:
                self._end_step()
        elif self._metas or self._order:  # frames seen this step: a new micro-step begins
            self._micro += 1

    def _end_step(self) -> None:
        stop = self._readback() if self._metas else None
        self._step += 1
        self._micro = self._order = 0
        self._last_grad = None
        o = self.options
        if stop is None and o.abort_after is not None and self._step > o.abort_after:
            message = (
                f"rank {self.rank}: stopped after step {o.abort_after} as asked "
                f"(abort_after={o.abort_after}); watch.report() has the frames."
            )
            stop = ("abort_after", OverflowStop, message)
        if stop is not None:
            self._stopped = stop[0]
            self.detach()
            raise stop[1](stop[2], self.report())

    def _readback(self) -> tuple[str, type[OverflowStop], str] | None:
        """Read the pending statistics back and process them; says whether to stop."""
        readout, syncs = self._buf.read()
        self.readbacks += syncs
        self._seen.clear()  # its slot numbers pointed into the buffer just read
        self._pseen.clear()
        metas = self._metas.copy()
        self._metas.clear()
        lowp = self._lowp or readout.low_precision
        self._lowp = False
        if self._fixed < 0:
            for key, need in readout.escalations().items():
                self._groups[key] = self._groups.get(key, 0) | need
        first = self._history.record(self._step, self._order, metas, readout, lowp)
        self._order += len(metas)
        if first is None or not self.options.stop_on_nonfinite:
            return None
        message = (
            f"rank {self.rank}: non-finite values at step {first.step}, {first.where}: "
            f"{first.describe()}. The frames before it: %dist_overflow --report "
            "(or watch.report().ring)."
        )
        return ("nonfinite", NonFiniteError, message)


def _process_rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def watch(
    model: nn.Module,
    *,
    frames: int = _DEFAULT.frames,
    trace_batches: Iterable[int] = _DEFAULT.trace_batches,
    abort_after: int | None = _DEFAULT.abort_after,
    phases: Sequence[Phase | str] = _DEFAULT.phases,
    rank: int | None = _DEFAULT.rank,
    headroom_warn_bits: float = _DEFAULT.headroom_warn_bits,
    stats: Stats | str = _DEFAULT.stats,
    step_on: StepOn | str = _DEFAULT.step_on,
    stop_on_nonfinite: bool = _DEFAULT.stop_on_nonfinite,
) -> Watch:
    """Watch `model` for overflow, underflow and non-finite values; returns the running `Watch`.

    The options are `distnb.records.overflow.WatchOptions`' fields: `frames` kept before the
    first non-finite one, `trace_batches` (steps whose every frame is kept), `abort_after`,
    `phases` (`forward`, `backward`, `grad`), `rank` (default: the process group's),
    `headroom_warn_bits`, `stats` (`fast` by default, `auto` or `full`), `step_on` (`forward` or
    `explicit`) and `stop_on_nonfinite`.

    Example::

        w = watch(model, trace_batches=[0], stop_on_nonfinite=True)
    """
    try:
        options = WatchOptions.of(
            frames=frames,
            trace_batches=tuple(trace_batches),
            abort_after=abort_after,
            phases=tuple(phases),
            rank=rank,
            headroom_warn_bits=headroom_warn_bits,
            stats=stats,
            step_on=step_on,
            stop_on_nonfinite=stop_on_nonfinite,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return Watch(model, options)
