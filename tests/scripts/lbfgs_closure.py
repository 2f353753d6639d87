"""LBFGS as pytorch/examples time_sequence_prediction drives it: each `optimizer.step(closure)`
calls the closure (forward + backward) many times. Asks `importlib.util.find_spec("torch")`
before importing torch, as the `datasets` package does. Prints the truth it knows."""

import argparse
import importlib.util

assert importlib.util.find_spec("torch") is not None  # before `import torch`

import torch  # noqa: E402
from torch import nn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-iter", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(64, 1)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=args.max_iter)
    calls = 0

    def closure() -> torch.Tensor:
        nonlocal calls
        calls += 1
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(args.steps):
        optimizer.step(closure)
    print(f"TRUTH steps={args.steps} closures={calls}")


if __name__ == "__main__":
    main()
