"""Trains a few steps, then fails the way scripts do: an exception (exit 1), or SIGKILL of itself
(`--kill`, as the OOM killer would) in the middle of training."""

import os
import signal
import sys

import torch
from torch import nn

model = nn.Linear(20, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    loss = model(torch.randn(8, 20)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 7:
        if "--kill" in sys.argv:
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("loss went NaN at step 8 (on purpose)")
