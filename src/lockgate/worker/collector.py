"""The garbage collector's young-generation threshold while workers run.

CPython collects its youngest generation every 700 net allocations of container
objects. A worker with a thousand calls in flight keeps tens of thousands of young
objects alive at any moment (requests, responses, coroutines, rendered prompts), so
nearly every collection finds them alive and promotes them; the older generations
then grow and are traversed again and again. Measured on one worker process with
1,000 calls in flight (``bench/worker_gc.py``, docs/benchmarks.md): about 2,400 young,
220 middle and 20 full collections took 5.3 s of a 15 s run and stalled the event loop
for up to 340 ms at a time. With the threshold above the in-flight working set,
collections become rare: the same run made 2 young collections. Cyclic garbage still
gets collected, once that many net allocations have piled up, so memory stays bounded.

The setting is process-wide: the first worker to start in a process raises it, the
last to stop puts back what it found.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

#: The young-generation threshold a worker uses unless configured: above the young
#: objects of ``concurrency`` calls in flight (a few dozen each), and never below 50,000.
PER_CALL = 50
FLOOR = 50_000

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None


def young_threshold(concurrency: int, configured: int | None) -> int:
    """The threshold to use: ``configured`` if set (0: leave the interpreter's), else
    ``max(FLOOR, PER_CALL * concurrency)``."""
    if configured is not None:
        return configured
    return max(FLOOR, PER_CALL * concurrency)


@contextlib.contextmanager
def raised_threshold(threshold: int) -> Iterator[None]:
    """Raise the young-generation threshold to at least ``threshold`` while inside (0:
    no change). Nests across workers of one process: the outermost exit restores the
    thresholds found on the first entry."""
    global _users, _saved
    if threshold <= 0:
        yield
        return
    with _lock:
        current = gc.get_threshold()
        if _users == 0:
            _saved = current
        _users += 1
        if threshold > current[0]:
            gc.set_threshold(threshold, *current[1:])
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
