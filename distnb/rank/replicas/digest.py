"""Digests of tensors' bits: `digests` of what is under some names, `digests_of` entries.

A tensor's digest (`_bits`: 64 bits, as 16 hex digits) is made of its bytes on its own device,
and the digests reach the host in one read per device. Replicas whose digests are equal hold
the same bytes, as far as these two guarantees go:

- a change within one 8-byte word of the bytes (any change of one element of up to 8 bytes, so
  any one bit: a sign, a NaN's payload, -0.0 for 0.0) always changes the digest, in every
  dtype, whatever the element's place;
- any other change (several elements, a swap, a shift, a whole tensor negated) changes it
  unless two 64-bit values that behave as random ones are equal: a chance of 2**-64 a
  comparison. It is a check against accidents, not a cryptographic hash: bytes chosen to
  collide can.

Why it holds is said where it is made (above `_ROW`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist

from distnb.rank.replicas.entries import Entry, entries_of
from distnb.records.replicas import Digest

__all__ = ["digests", "digests_of"]


def digests(names: Sequence[str], grads: bool, buffers: bool) -> list[Digest]:
    """A `Digest` of every tensor and value under `names` in this rank's namespace."""
    return digests_of(list(entries_of(names, grads, buffers)))


def digests_of(found: Sequence[Entry]) -> list[Digest]:
    """A `Digest` of each entry (see `entries_of`)."""
    rank = dist.get_rank()
    tensors = [(i, t) for i, (_, t, _) in enumerate(found) if isinstance(t, torch.Tensor)]
    sums = _bits([t for _, t in tensors])
    bits = {i: s for (i, _), s in zip(tensors, sums)}
    out = []
    for i, (name, obj, group) in enumerate(found):
        if isinstance(obj, torch.Tensor):
            shape, dtype = tuple(obj.shape), str(obj.dtype).removeprefix("torch.")
            nbytes = obj.numel() * obj.element_size()
            out.append(Digest(name, rank, group, bits[i], shape, dtype, nbytes))
        else:
            out.append(Digest(name, rank, group, "", value=repr(obj)))
    return out


# The digest of a tensor. Its bytes, read as int64 words w_0 .. w_n-1 (the last 1-7 bytes, if
# any, zero-padded into one word more), are cut into rows of `_ROW` words; row r sums to
#     S_r = sum over j of mix(w[r * _ROW + j] ^ key(j))      (int64, so modulo 2**64)
# and the digest is
#     sum over r of mix(S_r ^ key'(r))                       (modulo 2**64).
# Why a change within one word always changes it: `mix` is a bijection of 64-bit words (each of
# its steps can be undone: the xor of the high half into the low half by doing it again, a
# product by an odd number by a product by its inverse), and so is `^ key`. So a changed word
# changes its term of S_r, so S_r, so row r's term of the digest, and no other term changed to
# cancel it. An element of 1, 2, 4 or 8 bytes never straddles two words.
# Why changes of several words do not cancel: `mix` is a 64-bit hash's finalizer (degski's:
# xorshift by 32, product, xorshift, product, xorshift; measured on 65,536 random words, each
# input bit flips each output bit with probability 1/2 +- 0.007), so what a change does to a term
# looks random whatever the change was, and changes cancel only where random 64-bit values sum
# to 0. The previous digest, a linear sum of words times weights, could not do that: a change of
# a word's top bit (a sign) is 2**63 times its weight, 0 for an even weight and cancelled by a
# second one for odd weights. Mixing less does not do either: with one product between two
# xorshifts, the change a sign flip makes to a term takes few values (measured: of 65,536 random
# words, 936 had their change cancelled by another word's). The last step must be an xorshift:
# a product by a constant just before a sum factors out of it.
# Why the keys: a word's term depends on its place, so swapped or shifted words change the sum.
# Why rows: the keys kept are one row's (a Weyl sequence, as splitmix64's), the work can be cut
# into blocks of whole rows as suits the device, and the digest is the same on every device.
# Cost: ~7 passes over the words where the previous digest made 1 (docs/performance.md).
_ROW = 1 << 16
# Words mixed per step, in one temporary (the tensor's own words are never written), whatever the
# tensor's size. Measured: CPU, 2^18 to 2^20 words equally fast (2^16 and 2^22 slower), and the
# fewer steps the better on a busy machine (each step's parallel region waits for a thread);
# H100, 4.4 ms for 100 M float32 at 2^20 (launches), 2.1 ms at 2^22 to 2^26.
_BLOCK = {"cpu": 1 << 20}  # 8 MiB
_BLOCK_ELSEWHERE = 1 << 22  # 32 MiB
_WEYL = 0x9E3779B97F4A7C15 - 2**64  # 2**64 / golden ratio, odd; as int64 (products wrap)
_MUL = 0xD6E8FEB86659FD93 - 2**64
_WORD_SALT, _ROW_SALT = 0x632BE59BD9B4E019, 0x2545F4914F6CDD1D
_LOW = 0 if sys.byteorder == "little" else 1  # which int32 of an int64 holds its low half


def _bits(tensors: Sequence[torch.Tensor]) -> list[str]:
    """Each tensor's digest, as 16 hex digits; one read to the host per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out = [""] * len(tensors)
    for device, members in by_device.items():
        for i, h in zip(members, _digests([tensors[i] for i in members], device)):
            out[i] = f"{h % 2**64:016x}"
    return out


def _digests(tensors: Sequence[torch.Tensor], device: torch.device) -> list[int]:
    """The digests of `tensors` (all on `device`): every row of every tensor mixed with its
    number in one step, summed per tensor, read in one."""
    rows = [-(-_words(t) // _ROW) for t in tensors]
    # the rows' numbers and owners reach the device before any work is queued there: copying
    # them later would wait for that work
    number = torch.tensor([r for n in rows for r in range(n)], dtype=torch.int64).to(device)
    owner = torch.tensor([i for i, n in enumerate(rows) for _ in range(n)], dtype=torch.int64)
    owner = owner.to(device)
    sums = torch.cat([_row_sums(t) for t in tensors])
    mixed = _mix(sums.bitwise_xor_(_keys(number, _ROW_SALT)))
    total = torch.zeros(len(tensors), dtype=torch.int64, device=device)
    return [int(h) for h in total.index_add_(0, owner, mixed).tolist()]


def _words(t: torch.Tensor) -> int:
    """How many words `t`'s bytes make, the last one maybe partial."""
    return -(-t.numel() * t.element_size() // 8)


def _row_sums(t: torch.Tensor) -> torch.Tensor:
    """S_r of each row of `t`'s words, in blocks of rows: one temporary of a block's size."""
    raw = _bytes(t)
    n, rest = divmod(raw.numel(), 8)
    full = n - n % _ROW
    step = _BLOCK.get(raw.device.type, _BLOCK_ELSEWHERE)
    keys = _word_keys(raw.device)
    # one temporary for every block: allocating each anew costs more than mixing it (page faults)
    temp = torch.empty(min(step, full), dtype=torch.int64, device=raw.device)
    parts = []
    for a in range(0, full, step):
        words = _aligned(raw, a, min(a + step, full)).view(-1, _ROW)
        parts.append(_mixed_sums(words, keys, temp[: words.numel()].view(words.shape)))
    last = _aligned(raw, full, n)
    if rest:
        padded = torch.cat([raw[8 * n :], raw.new_zeros(8 - rest)]).view(torch.int64)
        last = torch.cat([last, padded])
    if last.numel():
        parts.append(_mixed_sums(last.view(1, -1), keys[: last.numel()]))
    return torch.cat(parts) if parts else raw.new_zeros(0, dtype=torch.int64)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t`'s elements in order, flat; a copy only where `t`'s memory is not in
    that order (a non-contiguous view) or holds other values (a lazily conjugated or negated
    view)."""
    flat = t.detach().resolve_conj().resolve_neg().reshape(-1)
    return flat.contiguous().view(torch.uint8)


def _aligned(raw: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Words a..b-1 of `raw` as int64; a copy of them only if they do not start on a multiple
    of 8 bytes (a view at an odd place in its storage)."""
    chunk = raw[8 * a : 8 * b]
    if chunk.storage_offset() % 8 or chunk.data_ptr() % 8:
        chunk = chunk.clone()
    return chunk.view(torch.int64)


def _mixed_sums(
    words: torch.Tensor, keys: torch.Tensor, temp: torch.Tensor | None = None
) -> torch.Tensor:
    """Each row's sum of mix(word ^ key), mixed in `temp` (the words are the user's); `keys` are
    the columns'."""
    return _mix(torch.bitwise_xor(words, keys, out=temp)).sum(1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """`x`, mixed in place word by word: degski's 64-bit hash finalizer, a bijection. Torch has
    no logical right shift of int64 (`>>` keeps the sign), so `x ^= x >>> 32` is done on the
    int32 halves: no temporary, no mask."""
    halves = x.view(torch.int32).view(*x.shape, 2)
    low, high = halves[..., _LOW], halves[..., 1 - _LOW]
    low.bitwise_xor_(high)
    x.mul_(_MUL)
    low.bitwise_xor_(high)
    x.mul_(_MUL)
    low.bitwise_xor_(high)
    return x


def _keys(index: torch.Tensor, salt: int) -> torch.Tensor:
    return index * _WEYL + salt


_WORD_KEYS: dict[torch.device, torch.Tensor] = {}


def _word_keys(device: torch.device) -> torch.Tensor:
    """key(j) for the words of a row, kept per device."""
    if device not in _WORD_KEYS:
        _WORD_KEYS[device] = _keys(torch.arange(_ROW, device=device), _WORD_SALT)
    return _WORD_KEYS[device]
