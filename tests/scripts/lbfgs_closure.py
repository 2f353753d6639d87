"""LBFGS as pytorch/examples time_sequence_prediction drives it: each `optimizer.step(closure)`
calls the closure (forward + backward) many times. Asks `importlib.util.find_spec("torch")`
before importing torch, as the `datasets` package does. Prints the truth it knows."""

import argparse
import importlib.util
import time

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
    calls, inside, stepping = 0, 0.0, 0.0

    def closure() -> torch.Tensor:
        nonlocal calls, inside
        calls += 1
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        inside += time.perf_counter() - start
        return loss

    for _ in range(args.steps):
        start = time.perf_counter()
        optimizer.step(closure)
        stepping += time.perf_counter() - start
    # the optimizer's own time is what optimizer.step spends outside its closure
    print(f"TRUTH steps={args.steps} closures={calls} optimizer_own_ms={(stepping - inside) * 1e3:.3f}")


if __name__ == "__main__":
    main()
