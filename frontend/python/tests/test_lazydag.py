"""The Python module against NumPy on random inputs: elementwise ops with
broadcasting, unary math, reductions, matmul, dtypes, devices, errors, and
the GIL released while a wait blocks."""
import ctypes
import inspect
import io
import json
import operator
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


def test_operators_take_numbers_arrays_and_nothing_else():
    x = rand((3, 4))
    a = nd.array(x)
    f32 = np.float32
    # Python and NumPy numbers, on either side, in place too
    np.testing.assert_array_equal((a + 2).asnumpy(), x + f32(2))
    np.testing.assert_array_equal((a * np.float64(0.5)).asnumpy(), x * f32(0.5))
    np.testing.assert_array_equal((a - np.int64(3)).asnumpy(), x - f32(3))
    np.testing.assert_array_equal((True + a).asnumpy(), x + f32(1))
    np.testing.assert_array_equal((2 - a).asnumpy(), f32(2) - x)
    np.testing.assert_array_equal((3 / a).asnumpy(), f32(3) / x)
    np.testing.assert_array_equal((a ** 2).asnumpy(), x ** 2)
    np.testing.assert_array_equal((a >= 0).asnumpy(), x >= 0)
    np.testing.assert_array_equal((a == a).asnumpy(), np.ones((3, 4), bool))
    np.testing.assert_array_equal((a != 1.5).asnumpy(), x != f32(1.5))
    b = a.copy()
    same = b
    b += 1
    b *= a
    b -= np.float32(0.25)
    b /= 2
    assert b is same  # in place: the same Python object
    np.testing.assert_allclose(b.asnumpy(), ((x + 1) * x - f32(0.25)) / 2, rtol=1e-6)
    # anything else is refused by both sides: a TypeError, nothing recorded
    lazydag.waitall()
    before = lazydag.engine_stats()["nodes_recorded"]
    for other in ("1", None, [1.0], object()):
        with pytest.raises(TypeError):
            a + other
        with pytest.raises(TypeError):
            other * a
        with pytest.raises(TypeError):
            a < other
    assert (a == None) is False  # noqa: E711 (falls back to identity)
    lazydag.flush_fused()
    assert lazydag.engine_stats()["nodes_recorded"] == before
    with pytest.raises(OverflowError):
        a + 10 ** 400


def test_operator_slots_agree_with_the_bound_methods():
    """+, -, *, / have number slots of their own (a fast path for arrays and
    Python numbers); they give what the bound methods give, raise what they
    raise, record nothing when refused, and leave other types their turn."""
    x, y = rand((3, 4)), rand((4,), lo=1, hi=5)
    a, b = nd.array(x), nd.array(y)
    for op, name in [(operator.add, "add"), (operator.sub, "sub"), (operator.mul, "mul"),
                     (operator.truediv, "truediv")]:
        np.testing.assert_array_equal(op(a, b).asnumpy(), getattr(a, f"__{name}__")(b).asnumpy())
        np.testing.assert_array_equal(op(a, 1.5).asnumpy(), getattr(a, f"__{name}__")(1.5).asnumpy())
        np.testing.assert_array_equal(op(3, a).asnumpy(), getattr(a, f"__r{name}__")(3).asnumpy())
        c = a.copy()
        same = c
        c = getattr(operator, f"i{name}")(c, b)
        assert c is same
        np.testing.assert_array_equal(c.asnumpy(), op(a, b).asnumpy())
    c, five, big = a.copy(), nd.ones((5,)), nd.ones((2, 3, 4))
    lazydag.waitall()
    before = lazydag.engine_stats()["nodes_recorded"]
    with pytest.raises(lazydag.InvalidArgument, match="broadcast"):
        a + five
    with pytest.raises(lazydag.InvalidArgument, match="broadcast"):
        five * a
    with pytest.raises(lazydag.InvalidArgument):
        c -= big  # the result would not fit c
    lazydag.flush_fused()
    assert lazydag.engine_stats()["nodes_recorded"] == before

    class Foreign:
        def __radd__(self, other):
            return "foreign radd"

        def __rmul__(self, other):
            return "foreign rmul"

    assert a + Foreign() == "foreign radd"
    assert a * Foreign() == "foreign rmul"
    with pytest.raises(TypeError):
        Foreign() - a


@pytest.mark.parametrize("name", ["exp", "log", "log1p", "tanh", "sigmoid", "sqrt", "relu", "abs"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_math_matches_numpy(name, dtype):
    x = rand((1000,), dtype, lo=0.01 if name in ("log", "log1p", "sqrt") else -20, hi=20)
    ref = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt, "abs": np.abs,
           "relu": lambda v: np.maximum(v, 0), "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "log1p": np.log1p}[name]
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


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
def test_the_buffer_protocol_exports_cpu_memory_without_a_copy(dtype):
    x = rand((6, 5), dtype) if dtype != np.bool_ else rand((6, 5)) > 0
    a = nd.array(x)
    y = a.T if dtype != np.bool_ else a
    before = lazydag.engine_stats()["blocking_waits"]
    m = memoryview(y)  # a blocker: waits for y's writes
    assert lazydag.engine_stats()["blocking_waits"] >= before + 1
    assert m.readonly and m.shape == y.shape
    v = np.asarray(y)
    np.testing.assert_array_equal(v, x.T if dtype != np.bool_ else x)
    if dtype == np.float32:
        # the same memory: a later in-place op shows through once it has run
        assert not v.flags.owndata
        a += 1
        a.wait_to_read()
        np.testing.assert_array_equal(v, x.T + 1)
        with pytest.raises(ValueError):
            v[0, 0] = 3  # read-only
    # a pending write is waited for
    z = nd.array(np.arange(4, dtype=np.float64)) * 2
    np.testing.assert_array_equal(np.asarray(memoryview(z)), [0, 2, 4, 6])
    # memory of another device is never exported implicitly
    with pytest.raises(lazydag.InvalidArgument, match="copyto"):
        memoryview(nd.array(np.ones(3)).copyto(lazydag.sim(0)))


def test_a_writable_export_waits_to_write_and_writes_through():
    a = nd.zeros((4,)) + 1  # a pending write
    want = np.array([7, 8, 9, 10], dtype=np.float32)
    assert io.BytesIO(want.tobytes()).readinto(a) == 16  # asks for a writable buffer
    np.testing.assert_array_equal(a.asnumpy(), want)
    with pytest.raises(BufferError, match="not C-contiguous"):
        (ctypes.c_float * 4).from_buffer_copy(a.reshape((2, 2)).T)  # asks for a plain contiguous buffer


def test_dlpack_shares_cpu_memory():
    x = rand((4, 3))
    a = nd.array(x) * 1  # a pending write
    assert a.__dlpack_device__() == (1, 0)  # kDLCPU
    v = np.from_dlpack(a.T)
    np.testing.assert_array_equal(v, x.T)
    a += 1  # the same memory: the in-place op shows through once it has run
    a.wait_to_read()
    np.testing.assert_array_equal(v, x.T + 1)
    w = np.from_dlpack(nd.array(np.arange(6, dtype=np.int64)).reshape((2, 3)))
    np.testing.assert_array_equal(w, np.arange(6).reshape(2, 3))
    c = a.__dlpack__()  # never consumed: its destructor lets the storage go
    del c
    with pytest.raises(lazydag.InvalidArgument, match="copyto"):
        np.from_dlpack(a.copyto(lazydag.sim(0)))
    with pytest.raises(lazydag.InvalidArgument, match="bool"):
        (a > 0).__dlpack__()


def test_sync_debug_names_the_python_line():
    x = nd.ones((3,)) + 1
    lazydag.clear_blocking_sites()
    lazydag.set_sync_debug("warn")
    try:
        line = inspect.currentframe().f_lineno + 1
        x.asnumpy()
    finally:
        lazydag.set_sync_debug("off")
    mine = [b for b in lazydag.blocking_sites() if b["file"] == __file__ and b["line"] == line]
    assert len(mine) == 1
    assert mine[0]["function"] == "test_sync_debug_names_the_python_line" and mine[0]["count"] == 1
    assert f"{__file__}:{line}" in lazydag.blocking_report()
    lazydag.set_sync_debug("error")
    try:
        with pytest.raises(lazydag.Error, match=f"wait_to_read\\(\\) at {__file__}:{inspect.currentframe().f_lineno + 1} "):
            x.wait_to_read()
    finally:
        lazydag.set_sync_debug("off")
        lazydag.clear_blocking_sites()


def test_the_profiler_writes_a_trace(tmp_path):
    lazydag.profiler.start()
    try:
        y = nd.ones((4, 4)) @ nd.ones((4, 4))
        y.wait_to_read()
    finally:
        lazydag.profiler.stop()
    assert lazydag.profiler.event_count() > 0
    path = tmp_path / "trace.json"
    lazydag.profiler.dump(str(path))
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert "matmul" in names


def test_sort_and_take_along_an_axis_match_numpy():
    x = RNG.integers(-3, 4, size=(3, 5, 4)).astype(np.float64)  # ties: stable order matters
    a = nd.array(x)
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(nd.argsort(a, axis=axis).asnumpy(), np.argsort(x, axis=axis, kind="stable"))
        np.testing.assert_array_equal(nd.sort(a, axis=axis).asnumpy(), np.sort(x, axis=axis))
        i = np.argsort(x, axis=axis, kind="stable")
        np.testing.assert_array_equal(nd.take_along_axis(a, nd.array(i), axis).asnumpy(),
                                      np.take_along_axis(x, i, axis))
        idx = np.array([[2, 0], [1, 1]])
        np.testing.assert_array_equal(nd.take(a, nd.array(idx), axis=axis).asnumpy(), np.take(x, idx, axis=axis))


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


def test_blocking_calls_release_the_gil():
    # Another Python thread runs while this one is blocked inside a call: in
    # waitall(), and in an op whose push the window stalls (the recording
    # thread helps run recorded work once max_pending_bytes are in flight).
    # A tick must fall in the middle of such a call, away from its ends
    # (where a switch of the interpreter could let the other thread run even
    # if the call held the GIL); the waitall waits for products queued on a
    # `sim` device. The ticking thread also needs a core: on a
    # loaded 2-core machine (other tests, busy-polling MPI ranks) it can go
    # without one for the length of a call, so a round that saw no tick is
    # run again, up to five times. A call that held the GIL would show no
    # tick inside it in any round.
    import sys
    import time

    def one_round(seed):
        stop = threading.Event()
        ticks = []

        def count():
            while not stop.is_set():
                ticks.append(time.perf_counter())

        calls = []

        def timed_call(fn):
            t0 = time.perf_counter()
            out = fn()
            calls.append((t0, time.perf_counter()))
            return out

        a = nd.random_uniform((1536, 1536), seed=seed)
        # On a stream device the work runs on the device's threads, so the
        # final waitall lasts as long as the queued products take.
        s = nd.random_uniform((768, 768), seed=seed, device=lazydag.sim(0))
        lazydag.waitall()
        t = threading.Thread(target=count)
        t.start()
        try:
            for _ in range(10):
                b = timed_call(lambda: a @ a)
                c = timed_call(lambda: b * (1.0 / 1536))
                a = timed_call(lambda: nd.tanh(c))
            for _ in range(4):
                s = nd.tanh((s @ s) * (1.0 / 768))
            timed_call(lazydag.waitall)
        finally:
            stop.set()
            t.join()
        margin = 0.01  # several switch intervals (1 ms)

        def ticks_inside(spans):
            return [x for x in ticks for t0, t1 in spans if t1 - t0 > 3 * margin and t0 + margin < x < t1 - margin]

        stalled_ops = [span for span in calls[:-1] if span[1] - span[0] > 3 * margin]
        wait = calls[-1]
        long_wait = wait[1] - wait[0] > 3 * margin
        assert stalled_ops or long_wait, "no call was long enough to tell"
        # None: not long enough to tell in this round. Products of 27 MiB of
        # buffers: the byte window stalls the recording thread.
        stalled_ok = bool(ticks_inside(stalled_ops)) if stalled_ops else None
        wait_ok = bool(ticks_inside([wait])) if long_wait else None
        return stalled_ok, wait_ok

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        rounds = []
        for seed in range(3, 8):
            rounds.append(one_round(seed))
            if False not in rounds[-1]:
                break
    finally:
        sys.setswitchinterval(interval)
    for kind, what in ((0, "a stalled op"), (1, "waitall")):
        seen = [r[kind] for r in rounds if r[kind] is not None]
        assert not seen or any(seen), "%s held the GIL in every round: %r" % (what, rounds)


def test_engine_counts_blocking_calls():
    before = lazydag.engine_stats()["blocking_waits"]
    x = nd.ones((4,)) + 1
    x.asnumpy()
    x.wait_to_read()
    assert lazydag.engine_stats()["blocking_waits"] >= before + 2
    assert lazydag.engine_policy() in ("lazy", "eager", "naive")


def test_autograd_mlp_gradients_match_numpy():
    x, t = rand((8, 5), np.float64, -1, 1), rand((8, 3), np.float64, -1, 1)
    w1, w2 = rand((5, 4), np.float64, -1, 1), rand((4, 3), np.float64, -1, 1)
    W1, W2 = nd.array(w1), nd.array(w2)
    W1.attach_grad()
    W2.requires_grad_(True)
    assert W1.requires_grad and W1.is_leaf and W1.grad is None
    h = nd.tanh(nd.array(x) @ W1)
    loss = nd.mse_loss(h @ W2, nd.array(t))
    assert loss.requires_grad and not loss.is_leaf
    loss.backward()
    # the same gradients written out in NumPy
    hn = np.tanh(x @ w1)
    d_out = 2 * (hn @ w2 - t) / t.size
    g2 = hn.T @ d_out
    g1 = x.T @ ((d_out @ w2.T) * (1 - hn ** 2))
    np.testing.assert_allclose(W2.grad.asnumpy(), g2, rtol=1e-12)
    np.testing.assert_allclose(W1.grad.asnumpy(), g1, rtol=1e-12)
    W1.zero_grad()
    assert W1.grad is None


def test_cross_entropy_and_its_gradient_match_numpy():
    z = rand((6, 4), np.float64, -3, 3)
    y = np.array([0, 3, 1, 1, 2, 0], dtype=np.int64)
    Z = nd.array(z)
    Z.attach_grad()
    loss = nd.cross_entropy(Z, nd.array(y))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert loss.item() == pytest.approx(-np.log(p[np.arange(6), y]).mean(), rel=1e-12)
    loss.backward()
    want = p.copy()
    want[np.arange(6), y] -= 1
    np.testing.assert_allclose(Z.grad.asnumpy(), want / 6, rtol=1e-12, atol=1e-15)
    # Smoothed targets (PyTorch's label_smoothing): 1 - e on the label, e / C everywhere.
    Z.zero_grad()
    e = 0.3
    q = np.full((6, 4), e / 4)
    q[np.arange(6), y] += 1 - e
    smoothed = nd.cross_entropy(Z, nd.array(y), label_smoothing=e)
    assert smoothed.item() == pytest.approx(-(q * np.log(p)).sum(1).mean(), rel=1e-12)
    smoothed.backward()
    np.testing.assert_allclose(Z.grad.asnumpy(), (p - q) / 6, rtol=1e-12, atol=1e-15)


def test_no_grad_and_in_place_rules():
    w = nd.array(np.ones(3, np.float32))
    w.attach_grad()
    with lazydag.autograd.no_grad():
        assert not lazydag.autograd.is_grad_enabled()
        assert not (w * 2.0).requires_grad
        w -= 0.5
    assert lazydag.autograd.is_grad_enabled()
    with pytest.raises(ValueError):
        w += 1.0
    a = nd.array(np.arange(3, dtype=np.float32))
    loss = (w * a).sum()
    a += 1.0
    with pytest.raises(ValueError, match="modified in place"):
        loss.backward()


def test_in_place_ops_in_the_gradient_graph_match_numpy():
    x, b = rand((3, 4), np.float64, -1, 1), rand((4,), np.float64, 1, 2)
    X, B = nd.array(x), nd.array(b)
    X.attach_grad()
    B.attach_grad()
    y = X * 2.0
    y += B          # the in-place ops of a result: differentiated as y = y + B ...
    y *= X          # ... and y = y * X, with y's values before the write
    y /= B
    y.sum().backward()
    # d/dx sum((2x + b) * x / b) = (4x + b) / b; d/db = sum over rows of -2x^2 / b^2
    np.testing.assert_allclose(X.grad.asnumpy(), (4 * x + b) / b, rtol=1e-12)
    np.testing.assert_allclose(B.grad.asnumpy(), (-2 * x * x / (b * b)).sum(0), rtol=1e-12)
    # Through a view: the write reaches y's values and its gradient.
    X.zero_grad()
    B.zero_grad()
    y = X * 3.0
    v = y.slice(1, 1, 3)
    v *= B.slice(0, 0, 2)  # columns 1 and 2 of y times b[0:2], broadcast over the rows
    (y * y).sum().backward()
    want = 3 * x.copy()
    want[:, 1:3] *= b[0:2]
    scale = np.ones(4)
    scale[1:3] = b[0:2]
    np.testing.assert_allclose(y.asnumpy(), want, rtol=1e-12)
    np.testing.assert_allclose(X.grad.asnumpy(), 2 * want * 3 * scale, rtol=1e-12)
    gb = np.zeros(4)
    gb[0:2] = (2 * want[:, 1:3] * 3 * x[:, 1:3]).sum(0)
    np.testing.assert_allclose(B.grad.asnumpy(), gb, rtol=1e-12)
    with pytest.raises(ValueError, match="view of a leaf"):
        w = X.slice(0, 0, 1)
        w += 1.0  # a view of a leaf that requires grad: refused


def test_npy_files_move_to_and_from_numpy(tmp_path):
    for x in [rand((3, 4)), rand((5,), np.float64), rand((2, 2), np.int64), np.array([True, False]),
              np.asfortranarray(rand((3, 2), np.float64))]:
        p = str(tmp_path / "a.npy")
        np.save(p, x)
        a = nd.load_npy(p)
        np.testing.assert_array_equal(a.asnumpy(), x)
        q = str(tmp_path / "b.npy")
        nd.save_npy(q, a)
        np.testing.assert_array_equal(np.load(q), x)
        assert np.load(q).dtype == x.dtype
