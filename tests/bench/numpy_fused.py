"""NumPy peer of bench_ndarray's fused expressions: the same two expressions
on 16M float32, with full-array operands and with per-feature rows of 1024
broadcast over a [16384, 1024] batch (names ending in _rows); median
milliseconds of 7 runs after a warm-up.
Prints `expr=<name> ms=<t>` lines (or `skipped=<why>`)."""
import sys
import time

try:
    import numpy as np
except ImportError as e:  # the benchmark prints the reason and goes on
    print(f"skipped=numpy unavailable ({e})")
    sys.exit(0)

N = 1 << 24
rng = np.random.default_rng(1)
x, w, b, m, s, g = (rng.random(N, dtype=np.float32) + 0.5 for _ in range(6))
F = 1024
x2 = x.reshape(N // F, F)
wr, br, mr, sr, gr = (rng.random(F, dtype=np.float32) + 0.5 for _ in range(5))


def median_ms(fn):
    fn()
    t = []
    for _ in range(7):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    t.sort()
    return t[len(t) // 2] * 1e3


exprs = {
    "sigmoid": lambda: 1.0 / (1.0 + np.exp(-(x * w + b))),
    "chain6": lambda: np.maximum((x - m) / s * g + b, 0.0),
    "sigmoid_rows": lambda: 1.0 / (1.0 + np.exp(-(x2 * wr + br))),
    "chain6_rows": lambda: np.maximum((x2 - mr) / sr * gr + br, 0.0),
}
for name, fn in exprs.items():
    print(f"expr={name} ms={median_ms(fn):.3f}")
