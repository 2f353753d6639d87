"""A tiny training loop whose step becomes a big matmul once a flag file exists (a job that slows
down at a step no one knew in advance). Beside the stop file: it saves ckpt.pt at step 5, stops
stepping while a file `pause` exists, and ends when the stop file exists (or after two minutes)."""

import os
import sys
import time

import torch

torch.set_num_threads(1)
flag, stop = sys.argv[1], sys.argv[2]
here = os.path.dirname(stop)  # as given: a relative stop file, a relative checkpoint path
pause = os.path.join(here, "pause")
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randn(32, 4)
big = torch.randn(512, 512)
deadline = time.monotonic() + 120
step = 0
while not os.path.exists(stop) and time.monotonic() < deadline:
    loss = torch.nn.functional.mse_loss(model(x), y)
    if os.path.exists(flag):
        loss = loss + torch.mm(big, big).mean() * 0
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if step == 5:
        torch.save(model.state_dict(), os.path.join(here, "ckpt.pt"))
    while os.path.exists(pause) and not os.path.exists(stop):
        time.sleep(0.05)
    time.sleep(0.002)
