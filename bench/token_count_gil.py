"""What a GIL-releasing token counter costs the event-loop thread when another Python
thread is busy (as a worker's database threads are while they build statements or read
rows). Times 2,000 short texts per counter, alone and beside one busy thread.

    python bench/token_count_gil.py
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lockgate.runtime.tokens import calibrated_count, default_estimator

TEXTS = [f"order {i}: the parcel arrived broken, refund please" for i in range(2000)]


def per_call_us(count: Callable[[str], int]) -> float:
    t0 = time.perf_counter()
    for text in TEXTS:
        count(text)
    return (time.perf_counter() - t0) / len(TEXTS) * 1e6


def main() -> None:
    est = default_estimator()
    counters: dict[str, Callable[[str], int]] = {"calibrated": calibrated_count}
    if est.exact:
        import tiktoken

        name = est.name.split(":", 1)[1]
        try:
            enc = tiktoken.get_encoding(name)
        except Exception:
            enc = tiktoken.get_encoding(f"{name}_offline")
        encode = enc.encode_ordinary
        counters[est.name] = lambda text: len(encode(text))  # uncached: every text is new
    stop = threading.Event()

    def busy() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    alone = {k: per_call_us(f) for k, f in counters.items()}
    th = threading.Thread(target=busy, daemon=True)
    th.start()
    try:
        beside = {k: per_call_us(f) for k, f in counters.items()}
    finally:
        stop.set()
        th.join()
    for k in counters:
        print(f"{k:28s} alone {alone[k]:8.1f} us/call   beside a busy thread "
              f"{beside[k]:8.1f} us/call")


if __name__ == "__main__":
    main()
