"""lazydag.dist from Python under mpirun (meson test dist.python.np2): every
collective against the value NumPy computes from what each rank holds, with
random inputs seeded per rank, and a failure on one rank reaching all.
Exits non-zero on the first mismatch."""
import sys

import numpy as np

import lazydag
from lazydag import dist, nd

if not dist.available():
    print("lazydag.dist: this build has no MPI")
    sys.exit(77)

dist.init()
me, n = dist.rank(), dist.size()


def rank_data(r, shape, dtype=np.float64):
    return np.random.default_rng(100 + r).uniform(-3, 3, size=shape).astype(dtype)


mine = rank_data(me, (6, 4))
everyone = [rank_data(r, (6, 4)) for r in range(n)]
a = nd.array(mine)

np.testing.assert_allclose(dist.allreduce(a).asnumpy(), sum(everyone), rtol=1e-12)
np.testing.assert_allclose(dist.allreduce(a, "mean").asnumpy(), sum(everyone) / n, rtol=1e-12)
np.testing.assert_array_equal(dist.allreduce(a, "max").asnumpy(), np.max(everyone, axis=0))
np.testing.assert_array_equal(dist.allreduce(a, "min").asnumpy(), np.min(everyone, axis=0))
np.testing.assert_array_equal(dist.broadcast(a, root=n - 1).asnumpy(), everyone[n - 1])
np.testing.assert_array_equal(dist.allgather(a).asnumpy(), np.concatenate(everyone))
parts = np.split(sum(everyone), n) if 6 % n == 0 else None
if parts is not None:
    np.testing.assert_allclose(dist.reduce_scatter(a).asnumpy(), parts[me], rtol=1e-12)

# integers, and arrays on the emulated device (staged through the host)
ints = nd.array(np.arange(5, dtype=np.int64) * (me + 1))
np.testing.assert_array_equal(dist.allreduce(ints).asnumpy(), np.arange(5) * sum(range(1, n + 1)))
on_sim = dist.allreduce(a.copyto(lazydag.sim(0)))
assert on_sim.device == lazydag.sim(0)
np.testing.assert_allclose(on_sim.asnumpy(), sum(everyone), rtol=1e-12)

# a ring of send/recv
dist.send(a, (me + 1) % n, tag=3)
got = dist.recv((6, 4), np.float64, (me - 1) % n, tag=3)
np.testing.assert_array_equal(got.asnumpy(), everyone[(me - 1) % n])

# a failed input on rank 0 fails the collective on every rank
bad = nd.array(np.array([1, 2], dtype=np.int32))
bad = bad / nd.zeros((2,), dtype=np.int32) if me == 0 else bad
try:
    dist.allreduce(bad).wait_to_read()
    sys.exit(f"rank {me}: the allreduce of a failed input did not fail")
except lazydag.OpError as e:
    assert me == 0 or "another rank" in str(e), str(e)
try:
    lazydag.waitall()
except lazydag.OpError:
    pass

with_bad_op = False
try:
    dist.allreduce(a, "product")
except lazydag.InvalidArgument as e:
    with_bad_op = "unknown reduction" in str(e)
assert with_bad_op

dist.barrier()
print(f"rank {me} of {n}: lazydag.dist from Python OK")
dist.finalize()
