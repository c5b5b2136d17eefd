"""Threads through the torch ops under the Triton interpreter, interleaved as on a GPU.

On a GPU each kernel launch is enqueued whole and the launches of threads sharing a stream
interleave; the interpreter instead runs a kernel's programs in Python, with state of its
own that two kernels interpreted at once would corrupt. `launches_interleaved()` makes each
interpreted launch atomic and hands the interpreter to another thread after each, so
threads interleave exactly at launch boundaries: the schedule under which calls that share
a workspace read each other's scratch.
"""

from __future__ import annotations

import contextlib
import threading
import time


@contextlib.contextmanager
def launches_interleaved():
    from triton.runtime import interpreter

    original = interpreter.InterpretedFunction.run
    lock = threading.Lock()

    def run(self, *args, **kwargs):
        with lock:
            result = original(self, *args, **kwargs)
        time.sleep(1e-4)  # let a waiting thread launch next
        return result

    interpreter.InterpretedFunction.run = run
    try:
        yield
    finally:
        interpreter.InterpretedFunction.run = original


def run_threads(target, count):
    """target(i) on `count` threads started together; re-raises the first failure."""
    errors = []
    barrier = threading.Barrier(count)

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
