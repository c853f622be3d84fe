"""`ShmBoard`: a board in a shared-memory file, for the ranks of a group that share a host.

The writer stamps the slot's head, writes payload, length and CRC32, then stamps its tail; a
reader takes the payload only when the tail, and after copying the head, carry the stamp it
wants and the CRC matches, so a torn read is seen as "not yet" and retried. A payload too big
for its slot spills into the store (`StoreBoard`), and the slot holds a marker.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re
import struct
import time
import zlib

from distnb.rank.checked import futex
from distnb.rank.checked.exchange.board import LAPPED, backoff_s
from distnb.rank.checked.exchange.store import StoreBoard

__all__ = ["SHM_DIR", "SPIN_NS", "ShmBoard", "cleanup", "shm_path"]

SHM_DIR = "/dev/shm"

SPIN_NS = 250_000  # a ShmBoard polls from this long before the post it expects (see `wait`)

# Slot layout: head stamp u64 | tail stamp u64 | payload length u32 | crc32 u32 | payload.
# Stamps use native, 8-byte aligned fields ("@Q" packs with one memcpy, which compiles to a single
# load/store), so a reader never sees half of a stamp; "<Q" would pack byte by byte.
_STAMP = struct.Struct("@Q")
_CHECK = struct.Struct("@II")
_HEADER = 24
_BELL = struct.Struct("@I")
_BELL_SPACING = 64
_BIG = b"@"  # fingerprints start with "F": this marks one too big for its slot


def shm_path(session_id: str, name: str) -> str:
    """The /dev/shm file of board `name` in session `session_id` (both sanitised)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"distnb-{session_id}-{name}")
    return os.path.join(SHM_DIR, safe)


def cleanup(session_id: str) -> int:
    """Remove every shared-memory board of a session (for the kernel at stop); returns a count."""
    prefix = os.path.basename(shm_path(session_id, ""))
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except OSError:
                pass
    return removed


class ShmBoard:
    """A board in a shared-memory file; every rank of the group maps the same file.

    Besides its slots, each ring has a **doorbell**: a 32-bit counter its writer bumps after
    every post, and that readers sleep on (`futex`). A reader reads the doorbell, looks at the
    slot, and sleeps only while the doorbell still holds what it read, so no post is missed.
    """

    def __init__(
        self,
        path: str,
        rings: int,
        depth: int,
        slot_size: int,
        overflow: StoreBoard | None = None,
    ) -> None:
        self.path = path
        self.depth = depth
        self.slot_size = slot_size
        self.capacity = slot_size - _HEADER
        self.overflow = overflow
        self.base = _BELL_SPACING * rings  # doorbells first, one cache line each
        size = self.base + rings * depth * slot_size
        # Every rank opens with O_CREAT and grows the file to the same size: whoever comes first
        # creates it, and a second ftruncate to the same size changes nothing. The file is sparse,
        # so only slots that are written take memory.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.unlinked = False
        self.spin_ns = SPIN_NS
        self.expect_ns = 0  # how long the last wait lasted: the guess for the next one
        self._anchor: ctypes.c_char | None = None
        self.address = 0
        if futex.AVAILABLE:
            self._anchor = ctypes.c_char.from_buffer(self.mm)
            self.address = ctypes.addressof(self._anchor)

    def _slot(self, ring: int, stamp: int) -> int:
        return self.base + (ring * self.depth + stamp % self.depth) * self.slot_size

    def post(self, ring: int, stamp: int, payload: bytes) -> None:
        if len(payload) > self.capacity:
            payload = self._spill(ring, stamp, payload)
        mm, off = self.mm, self._slot(ring, stamp)
        _STAMP.pack_into(mm, off, stamp)  # head first: readers see the slot is being rewritten
        start = off + _HEADER
        mm[start : start + len(payload)] = payload
        _CHECK.pack_into(mm, off + 16, len(payload), zlib.crc32(payload))
        _STAMP.pack_into(mm, off + 8, stamp)  # tail last: the payload is complete
        self._ring_bell(ring)

    def read(self, ring: int, stamp: int) -> bytes | None:
        mm, off = self.mm, self._slot(ring, stamp)
        tail = _STAMP.unpack_from(mm, off + 8)[0]
        if tail != stamp:
            return LAPPED if tail > stamp else None
        n, crc = _CHECK.unpack_from(mm, off + 16)
        start = off + _HEADER
        data = mm[start : start + n]
        if _STAMP.unpack_from(mm, off)[0] != stamp:
            return LAPPED  # rewritten while we copied: only a lapping p2p writer does that
        if zlib.crc32(data) != crc:
            return None  # torn read; the next poll sees the finished write
        if data[:1] == _BIG and self.overflow is not None:
            return self.overflow.read(ring, stamp)
        return data

    def block(self, ring: int, stamp: int, timeout_ns: int, attempt: int) -> None:
        """Sleep until ring's writer posts again (or `timeout_ns`); the caller re-checks."""
        __tracebackhide__ = True  # a rank released from here shows the user's line, not this
        bell = _BELL.unpack_from(self.mm, _BELL_SPACING * ring)[0]
        if self.read(ring, stamp) is not None:
            return
        if self.address:
            futex.wait(self.address + _BELL_SPACING * ring, bell, timeout_ns)
        else:
            time.sleep(backoff_s(attempt, timeout_ns))

    def window(self) -> tuple[int, int]:
        """When the next wait polls instead of sleeping, in ns from its start: `spin_ns`
        either side of the guess ((0, 0): it only sleeps)."""
        if not self.spin_ns:
            return 0, 0  # no window to wake up for
        return max(0, self.expect_ns - self.spin_ns), self.expect_ns + self.spin_ns

    def waited(self, ns: int) -> None:
        """A wait lasted `ns`. If the window would have caught it, spin in full next time;
        if not, half as long (one odd step does not stop the spinning; a peer that keeps
        arriving at unforeseeable times soon does)."""
        hit = abs(ns - self.expect_ns) <= SPIN_NS
        self.spin_ns = SPIN_NS if hit else self.spin_ns // 2
        self.expect_ns = ns

    def retract(self, ring: int, stamp: int) -> None:
        off = self._slot(ring, stamp)
        _STAMP.pack_into(self.mm, off + 8, 0)
        _STAMP.pack_into(self.mm, off, 0)
        self._ring_bell(ring)

    def _ring_bell(self, ring: int) -> None:
        at = _BELL_SPACING * ring
        _BELL.pack_into(self.mm, at, (_BELL.unpack_from(self.mm, at)[0] + 1) & 0xFFFFFFFF)
        if self.address:
            futex.wake(self.address + at)

    def forget(self) -> None:
        """Remove the file's name once every member has it mapped (after a first exchange):
        the mapping lives on, and a rank that dies later leaves nothing in /dev/shm."""
        if not self.unlinked:
            self.unlinked = True
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self, unlink: bool) -> None:
        self._anchor = None  # the mmap cannot close while ctypes holds a pointer into it
        self.address = 0
        self.mm.close()
        if unlink:
            self.forget()

    def _spill(self, ring: int, stamp: int, payload: bytes) -> bytes:
        """Put a payload larger than a slot in the store and leave a marker in the slot."""
        if self.overflow is None:
            raise ValueError(f"fingerprint of {len(payload)} bytes exceeds {self.capacity}")
        self.overflow.post(ring, stamp, payload)
        return _BIG
