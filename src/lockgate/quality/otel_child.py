"""The exporter process of OpenTelemetry traces (:class:`lockgate.quality.tracing.
ExportProcess`): ``python -m lockgate.quality.otel_child``, started by a worker that
exports spans over OTLP/HTTP. Reads batches of attempts on stdin, builds, encodes and
posts their spans with the exporter the ``OTEL_*`` environment configures, and answers
each batch with the counts of spans exported and failed; ends at the end of its input
(the worker stopped, or closed it), and quietly when the worker is gone (a closed pipe)
or its exporter cannot be built (the worker, left to export itself, says why)."""

from __future__ import annotations

import os
import signal
import sys

from lockgate.quality.tracing import EXPORT_PROCESS, Tracing, serve


def main() -> None:
    # It ends with its input: a stop signal sent to the worker's whole group (systemd's
    # default) must not cut off the spans the stopping worker still hands over.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # The answers go out on the stdout the worker reads; anything else printed here
    # goes to stderr, never into them.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        tracing = Tracing.from_env(lambda _name: None, {**os.environ, EXPORT_PROCESS: "0"},
                                   quiet=True)
    except Exception:  # the worker finds this process gone, tries to build the exporter
        sys.exit(2)  # itself and logs why it cannot: one message, not a traceback here
    if tracing is None:  # the environment asks for no traces: nothing to export
        return

    def write(data: bytes) -> None:
        answers.write(data)
        answers.flush()
    try:
        serve(tracing, sys.stdin.buffer.read, write)
    except BrokenPipeError:
        # The worker died (or was killed) with a batch in flight: nobody reads the
        # answer. Not a traceback in the worker's log; and the answer still buffered
        # goes nowhere when the interpreter flushes it at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), answers.fileno())
    finally:
        tracing.shutdown()


if __name__ == "__main__":
    main()
