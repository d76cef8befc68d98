"""The task ids one submit has met, kept compactly so that a file of millions of lines
is checked for repeated ids in little memory.

A line whose task id came on an earlier line with *another* task (another input, config,
batch, metadata or priority) is refused, naming both lines; a line repeated as it is is
the same task and passes. To tell them apart the check keeps, for every id, the line it
first came on and a 64-bit digest of its task.

The most recent ids are kept in a dict keyed by the id itself (the first
:data:`TaskIds.FIRST` ids, then :data:`TaskIds.CHUNK` at a time). When it fills, its
entries are frozen into sorted numpy arrays (a 64-bit and an independent 32-bit hash of
the id, the digest and the line: 24 bytes an id, where the dict takes about 150) and the
dict starts again. A Bloom filter over the frozen ids
(two probes in a table of 16 to 64 bits an id: at most about 1.4% false hits) answers
"never seen" for almost every new id in pure Python; only its hits look in the arrays.
Frozen runs are merged as a binary counter (sizes halve along the list) up to
:data:`TaskIds.RUN_CAP` ids (about a million), so a hit looks in a run per million ids
and a few more (a 10M-line file: about 14), and a merge never copies more than that
many ids at once (about 40 MB for a moment).

Two different frozen ids are taken for one only if both of their independent hashes
agree (about 2^-96 a pair). numpy is loaded only once a submit passes
:data:`TaskIds.FIRST` ids: a file of fewer (most files) never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from lockgate.errors import SpecError
from lockgate.store.types import NewTask

if TYPE_CHECKING:
    import numpy as np

_MASK = (1 << 64) - 1
#: Appended to an id for its second hash (a string no id is refused for holding is
#: fine: the two hashes of different strings are independent).
_SALT = "\x1f"
#: The first hash of an id (the builtin; a test narrows it to make ids collide).
_hash1 = hash
#: Bloom filter bits per frozen id, at the least (two probes: about 1.4% false hits).
_BITS_PER_ID = 16


def shown(value: str) -> str:
    """A value as an error message quotes it (cut at 40 characters)."""
    return repr(value) if len(value) <= 40 else repr(value[:40]) + "..."


class _Run(NamedTuple):
    """Frozen ids, sorted by their first hash."""

    k1: np.ndarray[Any, Any]
    k2: np.ndarray[Any, Any]
    digest: np.ndarray[Any, Any]
    line: np.ndarray[Any, Any]


class TaskIds:
    """The task ids of one file (or one call's tasks) met so far, each with its line
    and a digest of its task (see the module's docstring). Memory: about 28 bytes an id
    with the filter (a million-line file: about 28 MB) plus a bounded dict of the
    latest ids."""

    #: Ids kept in the dict before the first freeze into arrays (about 20 MB of dict
    #: at most; numpy's import costs about 0.1 s and 15 MB).
    FIRST = 1 << 17
    #: Ids kept in the dict before each later freeze.
    CHUNK = 1 << 14
    #: The largest frozen run a merge makes.
    RUN_CAP = 1 << 20

    def __init__(self) -> None:
        self._recent: dict[str, int] = {}  # id -> digest
        self._first: dict[str, int] = {}  # id -> its first line (the same keys)
        self._runs: list[_Run] = []
        self._frozen = 0  # ids in the runs
        self._bits = bytearray()  # the Bloom filter over the runs' first hashes
        self._bitmask = 0  # its size in bits, less one (a power of two, less one)
        self._limit = self.FIRST  # the dict's size at the next freeze

    def __len__(self) -> int:
        return len(self._recent) + self._frozen

    def check(self, row: NewTask, line: int, field: str = "task_id") -> None:
        """:class:`SpecError` when ``row``'s id came on an earlier line with another
        task (``field``: what the line calls its id)."""
        tid = row.task_id
        digest = hash((row.batch_id, row.config.hash, row.input_json, row.metadata_json,
                       row.priority)) & _MASK
        recent = self._recent
        known = recent.get(tid)
        if known is not None:
            if known != digest:
                raise _repeated(tid, field, self._first[tid], line)
            return
        if self._frozen:
            h = _hash1(tid)
            m = self._bitmask
            bits = self._bits
            i = h & m
            j = (h >> 32) & m
            if bits[i >> 3] >> (i & 7) & 1 and bits[j >> 3] >> (j & 7) & 1:
                found = self._lookup(tid, h)
                if found is not None:
                    first, first_digest = found
                    if first_digest != digest:
                        raise _repeated(tid, field, first, line)
                    return
        recent[tid] = digest
        self._first[tid] = line
        if len(recent) >= self._limit:
            self._freeze()

    def _lookup(self, tid: str, h: int) -> tuple[int, int] | None:
        """The first line and digest of a frozen ``tid`` (first hash ``h``), or None."""
        k2 = hash(tid + _SALT) >> 32
        for run in self._runs:
            at = int(run.k1.searchsorted(h))
            while at < len(run.k1) and int(run.k1[at]) == h:
                if int(run.k2[at]) == k2:
                    return int(run.line[at]), int(run.digest[at])
                at += 1  # another id with the same first hash: look on
        return None

    def _freeze(self) -> None:
        """Move the dict's ids into a sorted run, merge runs, update the filter."""
        import numpy as np

        recent = self._recent
        n = len(recent)
        k1 = np.fromiter(map(_hash1, recent), np.int64, n)  # a str caches its hash
        k2 = np.fromiter((hash(t + _SALT) >> 32 for t in recent), np.int32, n)
        digest = np.fromiter(recent.values(), np.uint64, n)
        line = np.fromiter(self._first.values(), np.int64, n)
        if n and line.min() >= 0 and line.max() <= 0xFFFFFFFF:
            line = line.astype(np.uint32)  # 4 bytes an id, not 8
        order = np.argsort(k1, kind="stable")
        new = k1
        runs = self._runs
        runs.append(_Run(k1[order], k2[order], digest[order], line[order]))
        recent.clear()
        self._first.clear()
        while (len(runs) > 1 and len(runs[-2].k1) <= len(runs[-1].k1)
               and len(runs[-2].k1) + len(runs[-1].k1) <= self.RUN_CAP):
            b = runs.pop()
            a = runs.pop()
            k1 = np.concatenate((a.k1, b.k1))
            order = np.argsort(k1, kind="stable")  # two sorted runs: a linear merge
            runs.append(_Run(k1[order], np.concatenate((a.k2, b.k2))[order],
                             np.concatenate((a.digest, b.digest))[order],
                             np.concatenate((a.line, b.line))[order]))
        self._frozen += n
        self._limit = self.CHUNK
        if self._frozen * _BITS_PER_ID > self._bitmask + 1:
            # Too full: a new filter with room for twice as many, from every run.
            size = 8
            while size < 2 * self._frozen * _BITS_PER_ID:
                size *= 2
            self._bits = bytearray(size // 8)
            self._bitmask = size - 1
            for run in runs:
                self._set_bits(run.k1)
        else:
            self._set_bits(new)  # the filter has room: add the new ids' bits

    def _set_bits(self, k1: np.ndarray[Any, Any]) -> None:
        import numpy as np

        m = np.int64(self._bitmask)
        at = np.sort(np.concatenate((k1 & m, (k1 >> 32) & m)))
        byte = at >> 3
        starts = np.flatnonzero(np.concatenate(([True], byte[1:] != byte[:-1])))
        masks = np.left_shift(np.uint8(1), (at & 7).astype(np.uint8))
        view = np.frombuffer(self._bits, dtype=np.uint8)
        view[byte[starts]] |= np.bitwise_or.reduceat(masks, starts)


def _repeated(tid: str, field: str, first: int, line: int) -> SpecError:
    return SpecError(f"{shown(tid)} is also the {field} of line {first}, with another "
                     "task: a task id names one task (the second would be skipped as "
                     "already present). Give one of them another id, or delete one",
                     field=field, line=line)
