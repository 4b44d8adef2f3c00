"""The experiments of the textbook's "Asynchronous Computation" section
(Dive into Deep Learning), written for MXNet there, on lazydag from Python:
10,000 `y = x + 1` waited for one by one versus recorded and waited for
once; `asnumpy()` and `item()` as implicit blockers; a loss logged to the
host every minibatch versus kept on the device. Each pair runs interleaved
five times; the medians and their ratios are printed as key=value lines
beside the textbook's figures.

    PYTHONPATH=build/frontend/python python3 docs/examples/async_d2l.py [n]
"""
import statistics
import sys
import time

import numpy as np

import lazydag
from lazydag import nd


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pair(name_a, fn_a, name_b, fn_b, repeats=5):
    """Median seconds of fn_a and fn_b, run alternately."""
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(fn_a))
        b.append(timed(fn_b))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name_a}_s={ma:.4f}")
    print(f"{name_b}_s={mb:.4f}")
    return ma, mb


def main(n):
    x = nd.ones((1, 2))
    print(f"engine={lazydag.engine_policy()} threads={lazydag.num_threads()} n={n}")

    # 1. Frontend and backend: wait after each op, or once at the end.
    # Fusion off here: each x + 1 is an op of its own, as in the textbook
    # (fused, the asynchronous loop's results, which nobody keeps, would
    # never be computed at all).
    fusion = lazydag.fusion_enabled()
    lazydag.set_fusion(False)

    def synchronous():
        for _ in range(n):
            y = x + 1
            y.wait_to_read()

    def asynchronous():
        for _ in range(n):
            y = x + 1
        lazydag.waitall()

    sync, asyn = pair("sync", synchronous, "async", asynchronous)
    lazydag.set_fusion(fusion)
    print(f"lesson=async ratio_sync_over_async={sync / asyn:.2f} textbook_ratio={3.16 / 0.93:.2f}")

    # 1a. The same code with the default settings. Each wait still runs its
    # x + 1; recorded ahead, a result that is dropped unread before its
    # group is recorded is never computed (one in 32 is, when a full group
    # is recorded): laziness, not overlap, makes this loop fast.
    sync, asyn = pair("sync_default", synchronous, "async_default", asynchronous)
    print(f"lesson=async_default fusion={int(lazydag.fusion_enabled())} ratio_sync_over_async={sync / asyn:.2f}")

    # 1b. The same with default settings, on a chain whose every result is
    # used (y = y + 1): waiting after each op runs each alone; recorded
    # ahead, consecutive ops are fused into nodes of up to 32 and run as one.
    def synchronous_chain():
        y = x
        for _ in range(n):
            y = y + 1
            y.wait_to_read()
        return y

    def asynchronous_chain():
        y = x
        for _ in range(n):
            y = y + 1
        y.wait_to_read()
        return y

    assert (synchronous_chain().asnumpy() == asynchronous_chain().asnumpy()).all()
    sync, asyn = pair("sync_chain", synchronous_chain, "async_chain", asynchronous_chain)
    print(f"lesson=async_chain fusion={int(lazydag.fusion_enabled())} ratio_sync_over_async={sync / asyn:.2f}")

    # 2. Implicit blockers: reading a value to the host every step.
    w = nd.random_normal((64, 64), seed=1) * 0.1
    data = nd.random_normal((32, 64), seed=2)

    def log_every_step():
        total = 0.0
        for _ in range(n // 20):
            loss = ((data @ w) ** 2).mean()
            total += loss.item()  # a blocker every step
        return total

    def keep_on_device():
        total = nd.zeros(())
        for _ in range(n // 20):
            loss = ((data @ w) ** 2).mean()
            total += loss
        return total.item()  # one blocker at the end

    blocking, device = pair("log_every_step", log_every_step, "keep_on_device", keep_on_device)
    print(f"lesson=blockers ratio_blocking_over_device={blocking / device:.2f}")

    # 3. A barrier per minibatch, or none.
    def barrier_each_step():
        v = nd.zeros((256,))
        for _ in range(n // 10):
            v = nd.tanh(v + 0.5)
            lazydag.waitall()

    def no_barrier():
        v = nd.zeros((256,))
        for _ in range(n // 10):
            v = nd.tanh(v + 0.5)
        lazydag.waitall()

    barrier, free = pair("barrier_each_step", barrier_each_step, "no_barrier", no_barrier)
    print(f"lesson=barrier ratio_barrier_over_none={barrier / free:.2f}")

    # 4. NumPy and lazydag agree on what they computed.
    got = (nd.array(np.arange(6.0).reshape(2, 3)) * 2).asnumpy()
    assert (got == np.arange(6.0).reshape(2, 3) * 2).all()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10000)
