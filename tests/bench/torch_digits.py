# The peer of bench_train: the same MLP, batch, optimizer and shuffled
# minibatches in PyTorch, on `threads` intra-op threads.
#   torch_digits.py digits.csv threads epochs [shuffled|first] [hidden lr smoothing]
# (hidden: comma-separated layer widths, default 128; lr default 2e-3;
# label smoothing default 0).
# Prints step_us= (median over epochs of epoch time / steps) and the
# test_accuracy= of the split (the first 1,500 rows of a seeded permutation,
# or of the file), or skipped=... when PyTorch is not installed.
import sys
import time

import numpy as np

try:
    import torch
except ImportError:
    print("skipped=no_torch")
    sys.exit(0)

path, threads, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
split = sys.argv[4] if len(sys.argv) > 4 else "shuffled"
hidden = [int(h) for h in sys.argv[5].split(",")] if len(sys.argv) > 5 else [128]
lr = float(sys.argv[6]) if len(sys.argv) > 6 else 2e-3
smoothing = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
torch.set_num_threads(threads)
d = np.loadtxt(path, delimiter=",")
if split == "shuffled":
    d = d[np.random.default_rng(2024).permutation(d.shape[0])]
x = torch.tensor(d[:1500, :64] / 16.0, dtype=torch.float32)
y = torch.tensor(d[:1500, 64], dtype=torch.long)
x_test = torch.tensor(d[1500:, :64] / 16.0, dtype=torch.float32)
y_test = torch.tensor(d[1500:, 64], dtype=torch.long)
torch.manual_seed(0)
layers, width = [], 64
for h in hidden:
    layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
    width = h
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
opt = torch.optim.Adam(model.parameters(), lr=lr)
g = torch.Generator().manual_seed(1)
times = []
steps = 0
for e in range(epochs + 2):
    t0 = time.perf_counter()
    order = torch.randperm(1500, generator=g)
    steps = 0
    for i in range(0, 1500, 64):
        idx = order[i:i + 64]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx], label_smoothing=smoothing)
        loss.backward()
        opt.step()
        steps += 1
    if e >= 2:  # two warm-up epochs
        times.append(time.perf_counter() - t0)
times.sort()
print(f"step_us={times[len(times) // 2] / steps * 1e6:.1f}")
with torch.no_grad():
    accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
print(f"split={split} test_accuracy={accuracy:.4f}")
