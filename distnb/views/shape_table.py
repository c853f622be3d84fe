"""Line up the ranks' shape scans by name: the pure half of the per-rank shape table.

`build_table` makes one row per name and one cell per rank. For each `Field` it compares the
ranks' values; where they differ, the cells that deviate are marked: the ranks outside a strict
majority, or every rank when there is no majority (with two ranks both are marked, since
nothing says which one is wrong). Devices are the exception: a tensor on its rank's own device
is the reference, so ranks that put theirs elsewhere are marked even when they are the majority.
Rows that differ come first, then rows holding NaN/Inf, then the rest, each in the order the
names first appear.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass

from distnb.errors import ConfigError
from distnb.records.shapes import Entry, Field, ModuleMeta, ShapeScan, TensorMeta

__all__ = ["ShapeRow", "ShapeTable", "build_table"]

OWN_DEVICE = "<own>"  # stands for a rank's own device when comparing devices
# Values that are right wherever they occur (tensor device, module devices).
PREFERRED: dict[Field, tuple[Hashable, ...]] = {Field.DEVICE: (OWN_DEVICE, (OWN_DEVICE,))}


@dataclass(frozen=True, slots=True)
class ShapeRow:
    """One name across ranks.

    `cells[i]` is the entry on `ShapeTable.ranks[i]`, None where the name is missing.
    `differs`: the fields where ranks disagree; `marked[i]`: the fields in which cell i deviates.
    `children`: a module's parameters and buffers, compared the same way.
    """

    name: str
    cells: tuple[Entry | None, ...]
    differs: tuple[Field, ...]
    marked: tuple[tuple[Field, ...], ...]
    nonfinite: bool
    children: tuple[ShapeRow, ...] = ()

    @property
    def is_module(self) -> bool:
        return any(isinstance(c, ModuleMeta) for c in self.cells)


@dataclass(frozen=True, slots=True)
class ShapeTable:
    """Rows for every name any rank reported; one column per rank, in rank order."""

    ranks: tuple[int, ...]
    devices: tuple[str, ...]
    rows: tuple[ShapeRow, ...]
    truncated: tuple[int, ...] = ()

    @property
    def differing(self) -> tuple[ShapeRow, ...]:
        return tuple(r for r in self.rows if r.differs)


def build_table(scans: Sequence[ShapeScan]) -> ShapeTable:
    """Compare scans from several ranks, name by name.

    Example::

        table = build_table([scan0, scan1])
        table.rows[0].differs  # (Field.SHAPE,) when rank 1's `x` has another shape
    """
    ordered = sorted(scans, key=lambda s: s.rank)
    ranks = tuple(s.rank for s in ordered)
    dupes = sorted(r for r, n in Counter(ranks).items() if n > 1)
    if dupes:
        raise ConfigError(f"build_table got two scans for rank {dupes[0]}; pass one scan per rank")
    devices = tuple(s.device for s in ordered)
    columns = [{e.name: e for e in s.entries} for s in ordered]
    names = _first_seen(n for s in ordered for n in (*(e.name for e in s.entries), *s.not_found))
    rows = _sort_rows(_row(name, [col.get(name) for col in columns], devices) for name in names)
    return ShapeTable(ranks, devices, rows, tuple(s.truncated for s in ordered))


def _row(name: str, cells: Sequence[Entry | None], devices: Sequence[str]) -> ShapeRow:
    values = [None if c is None else _values(c, d) for c, d in zip(cells, devices, strict=True)]
    marked: list[set[Field]] = [set() for _ in cells]
    differs: set[Field] = set()
    if any(c is None for c in cells):
        differs.add(Field.MISSING)
        for i, c in enumerate(cells):
            if c is None:
                marked[i].add(Field.MISSING)
    for f in Field:
        prefer = PREFERRED.get(f, ())
        for i in _deviants([None if v is None else v.get(f) for v in values], prefer):
            differs.add(f)
            marked[i].add(f)
    children = _children(cells, devices)
    for child in children:
        differs.update(child.differs)
        for i, fields in enumerate(child.marked):
            marked[i].update(fields)
    return ShapeRow(
        name=name,
        cells=tuple(cells),
        differs=_in_order(differs),
        marked=tuple(_in_order(m) for m in marked),
        nonfinite=any(c is not None and c.has_nonfinite for c in cells)
        or any(c.nonfinite for c in children),
        children=children,
    )


def _children(cells: Sequence[Entry | None], devices: Sequence[str]) -> tuple[ShapeRow, ...]:
    """A module's parameters and buffers as rows, aligned across ranks by their names."""
    modules = [c if isinstance(c, ModuleMeta) else None for c in cells]
    if not any(m is not None and (m.params or m.buffers) for m in modules):
        return ()
    present = [m for m in modules if m is not None]
    columns = [{} if m is None else {t.name: t for t in (*m.params, *m.buffers)} for m in modules]
    names = _first_seen(t.name for m in present for t in (*m.params, *m.buffers))
    # A rank without the module is already marked missing on the module row; its parameters
    # are not listed as missing one by one.
    live = [m is not None for m in modules]
    rows = []
    for name in names:
        row = _row(name, [col.get(name) for col in columns], devices)
        rows.append(_drop_absent(row, live))
    return _sort_rows(rows)


def _drop_absent(row: ShapeRow, live: Sequence[bool]) -> ShapeRow:
    if all(live) or Field.MISSING not in row.differs:
        return row
    marked = [m if ok else () for m, ok in zip(row.marked, live, strict=True)]
    still_missing = any(Field.MISSING in m for m in marked)
    differs = tuple(f for f in row.differs if f is not Field.MISSING or still_missing)
    return ShapeRow(row.name, row.cells, differs, tuple(marked), row.nonfinite, row.children)


def _values(entry: Entry, own: str) -> dict[Field, Hashable]:
    def rel(device: str) -> str:
        return OWN_DEVICE if device == own else device

    if isinstance(entry, TensorMeta):
        out: dict[Field, Hashable] = {
            Field.TYPE: "tensor",
            Field.SHAPE: entry.shape,
            Field.DTYPE: entry.dtype,
            Field.DEVICE: rel(entry.device),
            Field.REQUIRES_GRAD: entry.requires_grad,
            Field.GRAD: entry.has_grad,
        }
        if entry.has_nonfinite is not None:
            out[Field.NONFINITE] = (entry.has_nonfinite, entry.grad_nonfinite)
        return out
    out = {
        Field.TYPE: entry.type_name,
        Field.SHAPE: (entry.n_params, entry.param_numel, entry.n_buffers, entry.buffer_numel),
        Field.DTYPE: entry.dtypes,
        Field.DEVICE: tuple(sorted({rel(d) for d in entry.devices})),
        Field.REQUIRES_GRAD: entry.n_requires_grad,
        Field.GRAD: entry.n_grads,
    }
    if entry.n_nonfinite is not None:
        out[Field.NONFINITE] = (entry.n_nonfinite, entry.n_grads_nonfinite)
    return out


def _deviants(values: Sequence[Hashable | None], prefer: Collection[Hashable] = ()) -> list[int]:
    """Indices of the values outside a strict majority; all of them if there is none.

    A value in `prefer` is the reference whenever some rank has it: a tensor on the rank's own
    device is right even if most ranks put theirs on cuda:0. None (missing, or not checked)
    takes no part.
    """
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    counts = Counter(v for _, v in present)
    if len(counts) <= 1:
        return []
    top, n = counts.most_common(1)[0]
    ref = next((p for p in prefer if p in counts), None)
    if ref is not None:
        return [i for i, v in present if v != ref]
    if 2 * n > len(present):
        return [i for i, v in present if v != top]
    return [i for i, _ in present]


def _sort_rows(rows: Iterable[ShapeRow]) -> tuple[ShapeRow, ...]:
    return tuple(sorted(rows, key=lambda r: (not r.differs, not r.nonfinite)))


def _first_seen(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _in_order(fields: set[Field]) -> tuple[Field, ...]:
    return tuple(f for f in Field if f in fields)
