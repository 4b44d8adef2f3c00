"""The Python module against NumPy on random inputs: elementwise ops with
broadcasting, unary math, reductions, matmul, dtypes, devices, errors, and
the GIL released while a wait blocks."""
import threading

import numpy as np
import pytest

import lazydag
from lazydag import nd

RNG = np.random.default_rng(1234)
SHAPE_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((5,), ()),
               ((4, 1), (1, 5)), ((0, 3), (1, 3)), ((300, 200), (200,)), ((70000,), (70000,))]


def rand(shape, dtype=np.float32, lo=-5.0, hi=5.0):
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(int(lo), int(hi), size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("shapes", SHAPE_PAIRS)
def test_binary_ops_match_numpy(dtype, shapes):
    x, y = rand(shapes[0], dtype), rand(shapes[1], dtype)
    y = np.where(y == 0, 1, y).astype(dtype)
    a, b = nd.array(x), nd.array(y)
    assert a.dtype == np.dtype(dtype)
    np.testing.assert_array_equal((a + b).asnumpy(), x + y)
    np.testing.assert_array_equal((a - b).asnumpy(), x - y)
    np.testing.assert_array_equal((a * b).asnumpy(), x * y)
    np.testing.assert_array_equal(nd.maximum(a, b).asnumpy(), np.maximum(x, y))
    np.testing.assert_array_equal((a < b).asnumpy(), x < y)
    np.testing.assert_array_equal(nd.where(a < b, a, b).asnumpy(), np.where(x < y, x, y))
    if np.issubdtype(dtype, np.floating):
        np.testing.assert_allclose((a / b).asnumpy(), x / y, rtol=1e-6)
    else:  # C++ integer division truncates toward zero
        np.testing.assert_array_equal((a / b).asnumpy(), np.trunc(x / y).astype(dtype))


def test_scalars_take_the_array_dtype():
    x = rand((4, 5))
    a = nd.array(x)
    np.testing.assert_allclose((a * 2.5 + 1).asnumpy(), x * np.float32(2.5) + 1, rtol=1e-6)
    np.testing.assert_allclose((10.0 - a).asnumpy(), 10 - x, rtol=1e-6)
    i = nd.array(np.array([5, 7, -9], dtype=np.int32))
    np.testing.assert_array_equal((i / 2.0).asnumpy(), [2, 3, -4])
    with pytest.raises(lazydag.InvalidArgument, match="converted to int32 0"):
        i / 0.4


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "sqrt", "relu", "abs"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_math_matches_numpy(name, dtype):
    x = rand((1000,), dtype, lo=0.01 if name in ("log", "sqrt") else -20, hi=20)
    ref = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt, "abs": np.abs,
           "relu": lambda v: np.maximum(v, 0), "sigmoid": lambda v: 1 / (1 + np.exp(-v))}[name]
    got = getattr(nd, name)(nd.array(x)).asnumpy()
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=2e-6 if dtype == np.float32 else 1e-14,
                               atol=1e-30)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(axis, keepdims):
    x = rand((37, 53), np.float64)
    a = nd.array(x)
    for name in ("sum", "mean", "max", "min"):
        got = getattr(a, name)(axis=axis, keepdims=keepdims).asnumpy()
        np.testing.assert_allclose(got, getattr(x, name)(axis=axis, keepdims=keepdims), rtol=1e-12)
    got = a.argmax(axis=axis, keepdims=keepdims).asnumpy()
    np.testing.assert_array_equal(got, np.argmax(x, axis=axis, keepdims=keepdims))


def test_matmul_and_shapes_match_numpy():
    x, y = rand((64, 33), np.float64), rand((33, 17), np.float64)
    a, b = nd.array(x), nd.array(y)
    np.testing.assert_allclose((a @ b).asnumpy(), x @ y, rtol=1e-12)
    np.testing.assert_allclose(nd.dot(a, b).asnumpy(), x @ y, rtol=1e-12)
    np.testing.assert_array_equal(a.T.asnumpy(), x.T)
    np.testing.assert_array_equal(a.reshape(33, 64).asnumpy(), x.reshape(33, 64))
    np.testing.assert_array_equal(a.reshape((-1,)).asnumpy(), x.reshape(-1))
    np.testing.assert_array_equal(a.slice(1, 2, 9).asnumpy(), x[:, 2:9])
    np.testing.assert_array_equal(nd.concat([a, a], axis=0).asnumpy(), np.concatenate([x, x]))


def test_creation_dtypes_and_numpy_interop():
    assert nd.array(np.array([1, 2, 3])).dtype == np.int64
    assert nd.array(np.array([True, False])).dtype == np.bool_
    assert nd.array([1.5, 2.5]).dtype == np.float64
    assert nd.array(np.ones(3), dtype="float32").dtype == np.float32
    np.testing.assert_array_equal(nd.arange(5).asnumpy(), np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(nd.arange(2, 11, 3, dtype=np.int32).asnumpy(), [2, 5, 8])
    np.testing.assert_array_equal(nd.zeros((2, 3), dtype=np.int64).asnumpy(), np.zeros((2, 3)))
    z = nd.full((2, 2), 7.0)
    assert np.asarray(z).shape == (2, 2)
    assert np.asarray(z, dtype=np.float64).dtype == np.float64
    assert nd.full((), 4.0).item() == 4.0
    assert float(nd.full((1,), 2.0)) == 2.0
    assert nd.ones((3, 4)).shape == (3, 4) and nd.ones((3, 4)).size == 12 and len(nd.ones((3, 4))) == 3
    # a non-contiguous NumPy input is copied in logical order
    x = rand((5, 6))
    np.testing.assert_array_equal(nd.array(x.T).asnumpy(), x.T)


def test_devices_are_explicit():
    x = rand((8,))
    a = nd.array(x)
    s = a.copyto(lazydag.sim(0))
    assert s.device == lazydag.sim(0)
    np.testing.assert_array_equal((s * 2).asnumpy(), x * 2)
    with pytest.raises(lazydag.DeviceMismatch):
        a + s
    before = lazydag.engine_stats()["nodes_recorded"]
    same = s.as_in_device(lazydag.sim(0))  # already there: nothing recorded
    assert lazydag.engine_stats()["nodes_recorded"] == before
    np.testing.assert_array_equal(same.asnumpy(), x)
    np.testing.assert_array_equal(s.as_in_device(lazydag.cpu()).asnumpy(), x)


def test_errors_are_typed():
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError
        nd.ones((2, 3)) + nd.ones((4,))
    with pytest.raises(lazydag.InvalidArgument, match="too many elements"):
        nd.zeros((2 ** 32, 2 ** 32))
    bad = nd.array(np.array([4, 5], dtype=np.int32)) / nd.zeros((2,), dtype=np.int32)
    with pytest.raises(lazydag.OpError, match="integer division by zero"):
        bad.wait_to_read()
    lazydag.waitall()  # reported once


def test_a_wait_releases_the_gil():
    # Another Python thread runs while this one is blocked in waitall(): it
    # ticks in the middle of the wait, away from its ends (where a switch
    # of the interpreter could let it run even if the wait held the GIL).
    import time
    stop = threading.Event()
    ticks = []

    def count():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    a = nd.random_uniform((768, 768), seed=3)
    t = threading.Thread(target=count)
    t.start()
    try:
        for _ in range(30):
            a = nd.tanh(a @ a * (1.0 / 768))
        t0 = time.perf_counter()
        lazydag.waitall()
        t1 = time.perf_counter()
    finally:
        stop.set()
        t.join()
    margin = 0.03  # several switch intervals (5 ms)
    assert t1 - t0 > 3 * margin, "the wait was too short to tell"
    inside = [x for x in ticks if t0 + margin < x < t1 - margin]
    assert len(inside) > 0


def test_engine_counts_blocking_calls():
    before = lazydag.engine_stats()["blocking_waits"]
    x = nd.ones((4,)) + 1
    x.asnumpy()
    x.wait_to_read()
    assert lazydag.engine_stats()["blocking_waits"] >= before + 2
    assert lazydag.engine_policy() in ("lazy", "eager", "naive")
