"""A plain training script that never mentions traceml-ci.

traceml-ci run examples/zero_change.py   # steps are delimited by optimizer.step()
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
for x, y in DataLoader(data, batch_size=32, shuffle=True):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
