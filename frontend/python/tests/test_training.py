"""lazydag.nn, lazydag.optim and lazydag.MetricLog from Python, against
NumPy references: a Python-defined module's forward and one training step
(gradients by hand), SGD with momentum and Adam updates, registration and
lifetimes of Python modules, and a small classifier that learns."""
import gc

import numpy as np
import pytest

import lazydag as ld

nd = ld.nd


class MLP(ld.nn.Module):
    def __init__(self, n_in, n_hidden, n_out):
        super().__init__()
        self.fc1 = ld.nn.Linear(n_in, n_hidden, dtype=np.float64)
        self.fc2 = ld.nn.Linear(n_hidden, n_out, dtype=np.float64)

    def forward(self, x):
        return self.fc2(nd.relu(self.fc1(x)))


def params_np(module):
    return {name: p.asnumpy().copy() for name, p in module.named_parameters()}


def test_python_module_registers_its_parts_and_runs_forward():
    ld.nn.manual_seed(1)
    m = MLP(4, 8, 3)
    names = [n for n, _ in m.named_parameters()]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert all(p.requires_grad for p in m.parameters())
    x = np.random.default_rng(0).normal(size=(5, 4))
    p = params_np(m)
    h = np.maximum(x @ p["fc1.weight"] + p["fc1.bias"], 0)
    want = h @ p["fc2.weight"] + p["fc2.bias"]
    np.testing.assert_allclose(m(nd.array(x)).asnumpy(), want, rtol=1e-12, atol=1e-12)


def test_parameter_attribute_is_registered():
    class Scale(ld.nn.Module):
        def __init__(self):
            super().__init__()
            self.s = ld.nn.Parameter(nd.full([3], 2.0, dtype=np.float64))
            self.constant = nd.ones([3], dtype=np.float64)  # not trainable: not a parameter

        def forward(self, x):
            return x * self.s + self.constant

    m = Scale()
    assert [n for n, _ in m.named_parameters()] == ["s"]
    out = m(nd.ones([3], dtype=np.float64))
    np.testing.assert_array_equal(out.asnumpy(), [3.0, 3.0, 3.0])


def test_one_sgd_step_matches_hand_gradients():
    rng = np.random.default_rng(2)
    ld.nn.manual_seed(2)
    m = MLP(6, 5, 2)
    x = rng.normal(size=(7, 6))
    t = rng.normal(size=(7, 2))
    p = params_np(m)
    opt = ld.optim.SGD(m.parameters(), lr=0.1)
    loss = nd.mse_loss(m(nd.array(x)), nd.array(t))
    opt.zero_grad()
    loss.backward()
    opt.step()
    # the same step by hand: mse = mean((y - t)^2) over every element
    z1 = x @ p["fc1.weight"] + p["fc1.bias"]
    h = np.maximum(z1, 0)
    y = h @ p["fc2.weight"] + p["fc2.bias"]
    gy = 2 * (y - t) / y.size
    g = {"fc2.weight": h.T @ gy, "fc2.bias": gy.sum(0)}
    gz1 = (gy @ p["fc2.weight"].T) * (z1 > 0)
    g["fc1.weight"] = x.T @ gz1
    g["fc1.bias"] = gz1.sum(0)
    np.testing.assert_allclose(loss.item(), np.mean((y - t) ** 2), rtol=1e-12)
    after = params_np(m)
    for name in p:
        np.testing.assert_allclose(after[name], p[name] - 0.1 * g[name], rtol=1e-10, atol=1e-12, err_msg=name)


def reference_updates(kind, grads, lr, **kw):
    """Parameter trajectory of one parameter starting at 0 under the given
    gradients, by the published formulas (PyTorch's conventions)."""
    p = np.zeros_like(grads[0])
    b = m = v = None
    for t, g in enumerate(grads, start=1):
        if kind == "sgd":
            mu = kw["momentum"]
            b = g.copy() if b is None else mu * b + g
            p = p - lr * (g + mu * b if kw["nesterov"] else b)
        else:
            b1, b2 = kw["betas"]
            m = (1 - b1) * g if m is None else b1 * m + (1 - b1) * g
            v = (1 - b2) * g * g if v is None else b2 * v + (1 - b2) * g * g
            mhat = m / (1 - b1 ** t)
            vhat = v / (1 - b2 ** t)
            p = p - lr * mhat / (np.sqrt(vhat) + kw["eps"])
    return p


@pytest.mark.parametrize("kind", ["sgd", "sgd_nesterov", "adam"])
def test_optimizer_updates_match_the_formulas(kind):
    rng = np.random.default_rng(3)
    grads = [rng.normal(size=(4, 3)) for _ in range(5)]
    w = ld.nn.Parameter(nd.zeros([4, 3], dtype=np.float64))
    if kind == "adam":
        opt = ld.optim.Adam([w], lr=0.05, betas=(0.8, 0.99), eps=1e-6)
        want = reference_updates("adam", grads, 0.05, betas=(0.8, 0.99), eps=1e-6)
    else:
        nesterov = kind == "sgd_nesterov"
        opt = ld.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=nesterov)
        want = reference_updates("sgd", grads, 0.1, momentum=0.9, nesterov=nesterov)
    for g in grads:
        opt.zero_grad()
        (w * nd.array(g)).sum().backward()  # d/dw = g
        opt.step()
    assert opt.steps == len(grads)
    np.testing.assert_allclose(w.asnumpy(), want, rtol=1e-10, atol=1e-12)
    # A schedule: a zero rate leaves the parameters as they are.
    assert opt.lr == pytest.approx(0.05 if kind == "adam" else 0.1)
    opt.lr = 0.0
    opt.zero_grad()
    (w * nd.array(grads[0])).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.asnumpy(), want, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        opt.lr = -1.0


def test_python_modules_held_only_by_a_sequential_survive():
    ld.nn.manual_seed(4)
    seq = ld.nn.Sequential(MLP(3, 4, 2), ld.nn.Tanh())
    seq.add(ld.nn.Linear(2, 2, dtype=np.float64))
    gc.collect()
    assert len(seq) == 3
    assert len(seq.parameters()) == 6
    out = seq(nd.ones([2, 3], dtype=np.float64)).asnumpy()
    assert out.shape == (2, 2) and np.all(np.isfinite(out))


def test_a_classifier_learns_with_the_loss_logged_on_the_device():
    rng = np.random.default_rng(5)
    centers = rng.normal(scale=3.0, size=(3, 2))
    labels = rng.integers(0, 3, size=300)
    points = centers[labels] + rng.normal(size=(300, 2))
    ld.nn.manual_seed(5)
    model = MLP(2, 16, 3)
    opt = ld.optim.Adam(model.parameters(), lr=0.05)
    x = nd.array(points)
    y = nd.array(labels.astype(np.int32))
    losses = []
    log = ld.MetricLog("loss", 50, lambda first, values: losses.extend(values))
    for _ in range(150):
        loss = nd.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.append(loss)  # a device-side copy: no blocking read per step
    log.flush()
    assert len(losses) == 150
    assert losses[-1] < 0.5 * losses[0]
    predicted = model(x).asnumpy().argmax(1)
    assert (predicted == labels).mean() > 0.9


def test_register_parameter_refused_on_a_builtin_module():
    with pytest.raises(ValueError):
        ld.nn.Linear(2, 2).register_parameter("extra", nd.ones([2]))


def test_fusion_switch():
    was = ld.fusion_enabled()
    try:
        ld.set_fusion(False)
        assert not ld.fusion_enabled()
        ld.set_fusion(True)
        x = nd.ones([4])
        y = nd.sigmoid(x * 2.0 + 1.0)
        ld.flush_fused()
        np.testing.assert_allclose(y.asnumpy(), 1 / (1 + np.exp(-3.0)), rtol=1e-6)
    finally:
        ld.set_fusion(was)


def test_math_methods_match_numpy():
    x = np.random.default_rng(6).uniform(0.1, 3.0, size=(4, 5))
    a = nd.array(x)
    np.testing.assert_allclose(a.exp().asnumpy(), np.exp(x), rtol=1e-12)
    np.testing.assert_allclose(a.log1p().asnumpy(), np.log1p(x), rtol=1e-12)
    np.testing.assert_allclose((a - 1.0).abs().asnumpy(), np.abs(x - 1.0), rtol=1e-12)
    np.testing.assert_allclose((a - 1.0).relu().asnumpy(), np.maximum(x - 1.0, 0), rtol=1e-12)
