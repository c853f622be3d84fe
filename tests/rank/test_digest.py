"""The replica digest, flipped bit by bit: any change of any bit of any element changes it.

Pure and in-process (no process group): `_bits` is called on tensors built here. Each test
digests every variant in one call and asks that all the digests differ from the original's and
from each other's, which is stronger than "each one changed" and costs nothing more. The cases
the previous digest (a linear sum of words times weights, modulo 2**64) lost are among them: a
top-bit difference in a word of even weight, two top-bit differences, a tensor and its negation.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import distnb.rank.replicas.digest as digest
from distnb.rank.replicas.digest import _bits

# every dtype a tensor can have whose elements are whole bytes (torch 2.13); bool holds 0 or 1
FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
F8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
FLOAT8 = [getattr(torch, name) for name in F8 if hasattr(torch, name)]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64]
UINTS = [torch.uint8, torch.uint16, torch.uint32, torch.uint64]
COMPLEX = [torch.complex64, torch.complex128]
BYTES = FLOATS + FLOAT8 + INTS + UINTS + COMPLEX  # any byte pattern is an element
DTYPES = [*BYTES, torch.bool]
N = 13  # elements: 13 x 1, 2 or 4 bytes ends in a partial word (5, 2 or 4 bytes)


def random_tensor(dtype: torch.dtype, n: int = N, seed: int = 0) -> torch.Tensor:
    """`n` elements of random bytes (of 0s and 1s for bool)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g).view(dtype)


def flipped(t: torch.Tensor, *bits: tuple[int, int]) -> torch.Tensor:
    """A copy of `t` with bit `b` of element `e` flipped, for each (e, b)."""
    out = t.clone()
    raw = out.view(-1).view(torch.uint8)
    for e, b in bits:
        raw[e * t.element_size() + b // 8] ^= 1 << (b % 8)
    return out


def positions(t: torch.Tensor) -> list[int]:
    """The first element, one in the middle, the last, and the first in a partial last word."""
    n, size = t.numel(), t.element_size()
    at = {0, n // 2, n - 1}
    if (n * size) % 8:
        at.add((n * size) // 8 * 8 // size)  # the first element of the partial word
    return sorted(at)


def all_distinct(*tensors: torch.Tensor) -> None:
    """The tensors' digests are 16 hex digits each, and no two are equal."""
    found = _bits(list(tensors))
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in found), found
    shared = {h: [i for i, g in enumerate(found) if g == h] for h in found if found.count(h) > 1}
    assert not shared, f"variants that share a digest: {list(shared.values())[:3]}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_bit_of_an_element_changes_the_digest(dtype: torch.dtype) -> None:
    t = random_tensor(dtype)
    bits = 1 if dtype == torch.bool else 8 * t.element_size()
    all_distinct(t, *(flipped(t, (e, b)) for e in positions(t) for b in range(bits)))


@pytest.mark.parametrize("dtype", BYTES, ids=str)
def test_0d_tensors_every_bit(dtype: torch.dtype) -> None:
    t = random_tensor(dtype, 1).reshape(())
    all_distinct(t, *(flipped(t, (0, b)) for b in range(8 * t.element_size())))


def test_the_reported_repro_a_negated_element() -> None:
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    negated = [t.clone() for _ in range(4)]
    for i, u in enumerate(negated):
        u[i] = -u[i]
    all_distinct(t, *negated)
    w = torch.nn.Linear(4, 3).double().weight.detach()
    u = w.clone()
    u[0, 1] = -u[0, 1]
    all_distinct(w, u)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_pairs_of_sign_flips_in_different_words(dtype: torch.dtype) -> None:
    """Two top-bit differences cancelled in the previous digest whatever the weights."""
    t = random_tensor(dtype, 16)
    top = 8 * t.element_size() - 1
    pairs = itertools.combinations(range(16), 2)
    all_distinct(t, *(flipped(t, (i, top), (j, top)) for i, j in pairs))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int8], ids=str)
def test_the_same_bit_flipped_in_two_elements(dtype: torch.dtype) -> None:
    t = random_tensor(dtype, 12)
    bits = range(8 * t.element_size())
    pairs = [(0, 1), (0, 11), (3, 8), (5, 6)]
    all_distinct(t, *(flipped(t, (i, b), (j, b)) for i, j in pairs for b in bits))


@pytest.mark.parametrize("dtype", FLOATS + FLOAT8[:1] + COMPLEX, ids=str)
@pytest.mark.parametrize("n", [1, 2, 4, 7, 16, 1000, 1 << 17])
def test_a_tensor_and_its_negation(dtype: torch.dtype, n: int) -> None:
    """Every sign flipped: an even count of top-bit differences, which cancelled in pairs."""
    x = torch.rand(n) + 0.5  # no zeros: -0.0 is another case, below
    if dtype.is_complex:
        x = torch.complex(x, x.flip(0))
    all_distinct(x.to(dtype), (-x).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS + FLOAT8[:1], ids=str)
def test_zeros_and_one_negative_zero(dtype: torch.dtype) -> None:
    zeros = torch.zeros(9, dtype=dtype)
    variants = [zeros.clone() for _ in range(9)]
    for i, v in enumerate(variants):
        v[i] = -0.0
        assert torch.signbit(v[i].float())  # only the sign bit is set
    all_distinct(zeros, *variants)


def test_swaps_and_shifts() -> None:
    t = torch.arange(1.0, 10.0)
    swapped = []
    for i, j in itertools.combinations(range(9), 2):
        u = t.clone()
        u[[i, j]] = u[[j, i]]
        swapped.append(u)
    all_distinct(t, t.roll(1), t.roll(-1), t.flip(0), *swapped)


def test_flips_across_rows_blocks_and_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor of several rows and a partial last word: flips in each,
    the same flip in two rows, and the same flips in the second of two tensors digested
    together."""
    row = digest._ROW
    t = random_tensor(torch.float32, 2 * (4 * row + row + 3) + 1)  # 5 rows, 3 words, 4 bytes
    n, top = t.numel(), 31
    at = [0, 2 * row - 1, 2 * row, 2 * 4 * row + 5, n - 2, n - 1]
    singles = [flipped(t, (e, b)) for e in at for b in (0, 17, top)]
    pairs = [flipped(t, (e, top), (e + 2 * row, top)) for e in (0, 1, 7)]  # same place, next row
    all_distinct(t, *singles, *pairs, t.roll(1), -t)
    other = random_tensor(torch.float64, 100)
    base = _bits([other, t])
    for v in [*singles, *pairs]:
        together = _bits([other, v])
        assert together[0] == base[0] and together[1] != base[1]  # each tensor its own digest
    # whatever blocks a device cuts the work into, the digest is the same
    monkeypatch.setitem(digest._BLOCK, "cpu", row)
    assert _bits([other, t]) == base


def test_equal_values_give_equal_digests_however_held() -> None:
    t = torch.randn(6, 5)
    base = _bits([t])[0]
    assert _bits([t.clone(), t.t().contiguous().t()]) == [base, base]
    view = t.t()  # non-contiguous
    assert not view.is_contiguous()
    assert _bits([view]) == _bits([view.contiguous()])
    for dtype in (torch.float32, torch.float16, torch.uint8, torch.float64):
        x = random_tensor(dtype, 37)
        for skip in (1, 3):  # at an odd place in its storage (1 to 24 bytes in)
            storage = torch.zeros(37 + skip, dtype=dtype)
            storage[skip:] = x
            assert storage[skip:].storage_offset() == skip
            assert _bits([storage[skip:]]) == _bits([x]), (dtype, skip)
    c = torch.randn(5, dtype=torch.complex64)
    assert _bits([c.conj()]) == _bits([c.conj().resolve_conj()])  # a lazily conjugated view
    assert c.conj().imag.is_neg()
    assert _bits([c.conj().imag]) == _bits([-c.imag])  # a lazily negated view
    assert _bits([torch.zeros(0), torch.zeros(0, 3)]) == _bits([torch.zeros(0), torch.zeros(0)])


@pytest.mark.gpu
def test_a_device_gives_the_cpus_digest() -> None:
    """Replicas may sit on different devices (a CPU copy of a GPU tensor): the digest is the
    digest of the bytes, wherever it is made."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    row = digest._ROW
    found = [random_tensor(d, 3) for d in DTYPES]
    found += [random_tensor(torch.float32, 9 * row + 3), torch.randn(300, 7).t()]
    on_gpu = [t.cuda() for t in found]
    assert _bits(on_gpu) == _bits(found)
    assert _bits(on_gpu + found) == _bits(found) * 2  # two devices in one call
