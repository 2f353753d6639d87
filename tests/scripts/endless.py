"""Trains until interrupted (Ctrl-C), the way a user stops a long job."""

import torch
from torch import nn

model = nn.Linear(20, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    loss = model(torch.randn(8, 20)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
