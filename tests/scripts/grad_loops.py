"""Training loops that take their gradients with `torch.autograd.grad` (prints the truth it knows):
functional  no optimizer: the gradients of the loss, then a hand-written update — a step each;
penalty     an optimizer, and a WGAN-GP-style gradient penalty taken with create_graph=True
            inside each step: its time is backward, and it is no step of its own."""

import argparse
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("functional", "penalty"))
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 1))
    params = list(model.parameters())
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    optimizer = torch.optim.SGD(params, lr=0.01) if args.mode == "penalty" else None
    # inside torch.autograd.grad and backward(), as this script times them, step by step
    grad_ms: list[float] = []
    backward_ms: list[float] = []
    for _ in range(args.steps):
        if optimizer is None:
            loss = nn.functional.mse_loss(model(x), y)
            start = time.perf_counter()
            grads = torch.autograd.grad(loss, params)
            grad_ms.append((time.perf_counter() - start) * 1e3)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p -= 0.01 * g
            continue
        optimizer.zero_grad()
        inputs = x.clone().requires_grad_(True)
        out = model(inputs)
        total = out.sum()  # a forward op: outside the clock around autograd.grad
        start = time.perf_counter()
        (slopes,) = torch.autograd.grad(total, inputs, create_graph=True)
        grad_ms.append((time.perf_counter() - start) * 1e3)
        penalty = ((slopes.norm(dim=1) - 1) ** 2).mean()
        loss = nn.functional.mse_loss(out, y) + penalty
        start = time.perf_counter()
        loss.backward()
        backward_ms.append((time.perf_counter() - start) * 1e3)
        optimizer.step()
    print(
        f"TRUTH steps={args.steps} grad_ms={sum(grad_ms):.3f} backward_ms={sum(backward_ms):.3f}",
        f"step_grad_ms={','.join(f'{ms:.3f}' for ms in grad_ms)}",
        f"step_backward_ms={','.join(f'{ms:.3f}' for ms in backward_ms)}",
    )


if __name__ == "__main__":
    main()
