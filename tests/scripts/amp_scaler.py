"""Mixed precision on the CPU with a GradScaler that skips steps (prints the truth it knows): its
initial scale is far too high, so its first steps find inf gradients and skip the optimizer's step
while the scale comes down; two NaN losses later in the run skip two more."""

import time

import torch
from torch import nn

STEPS, NAN_AT = 40, (25, 31)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    skipped, scaler_step_ms = [], []  # the iterations whose update the scaler skipped; time inside scaler.step
    for it in range(STEPS):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        if it in NAN_AT:
            loss = loss * float("nan")
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        start = time.perf_counter()
        scaler.step(optimizer)
        scaler_step_ms.append(1e3 * (time.perf_counter() - start))
        scaler.update()
        if scaler.get_scale() < scale:  # the scale comes down exactly when the step was skipped
            skipped.append(it)
    print(
        f"TRUTH steps={STEPS} skipped={','.join(map(str, skipped))}",
        f"scaler_step_ms={','.join(f'{ms:.3f}' for ms in scaler_step_ms)}",
    )


if __name__ == "__main__":
    main()
