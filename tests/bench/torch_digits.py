# The peer of bench_train: the same 64-128-10 MLP, batch, optimizer and
# shuffled minibatches in PyTorch, on `threads` intra-op threads.
#   torch_digits.py digits.csv threads epochs [shuffled|first]
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
torch.set_num_threads(threads)
d = np.loadtxt(path, delimiter=",")
if split == "shuffled":
    d = d[np.random.default_rng(2024).permutation(d.shape[0])]
x = torch.tensor(d[:1500, :64] / 16.0, dtype=torch.float32)
y = torch.tensor(d[:1500, 64], dtype=torch.long)
x_test = torch.tensor(d[1500:, :64] / 16.0, dtype=torch.float32)
y_test = torch.tensor(d[1500:, 64], dtype=torch.long)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
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
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
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
