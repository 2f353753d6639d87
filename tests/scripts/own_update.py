"""A training loop with no torch optimizer: the script updates its parameters itself, under
torch.no_grad(), after backward() (prints the truth it knows: its own clock around each update).

    sgd        `p -= lr * p.grad` for each parameter of a module, batches from a DataLoader
    data       `p.data.add_(p.grad, alpha=-lr)` (the old style, still under no_grad)
    decorated  the update in a function decorated with @torch.no_grad()
    metric     an accuracy computed under no_grad after backward(), before the update: not the update
    tensors    no module: weights as plain tensors that require grad, a function as the model
    bare       `p.data.add_(p.grad, alpha=-lr)` outside no_grad, after clip_grad_norm_ and before
               `loss.item()` (pytorch/examples' word_language_model)
    bare_set   `p.data = p.data - lr * p.grad` outside no_grad (the assignment style)
    bare_read  each parameter's `p.data.norm()` logged after backward(), outside no_grad, before an
               update under no_grad: the reads are not the update
    bare_functional  the `bare` update of plain tensors with a function as the model and the loss,
               on batches drawn before training: nothing but backward() between two updates
"""

import argparse
import sys
import time

import torch
from torch import nn


@torch.no_grad()
def sgd(params, lr):
    for p in params:
        p -= lr * p.grad
        p.grad = None


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = ("sgd", "data", "decorated", "metric", "tensors", "bare", "bare_set", "bare_read", "bare_functional")
    parser.add_argument("mode", choices=modes)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.mode in ("tensors", "bare_functional"):
        weights = [(torch.randn(64, 1024 * 16) * 0.05).requires_grad_(), torch.zeros(1024 * 16, requires_grad=True)]
        head = [(torch.randn(1024 * 16, 10) * 0.05).requires_grad_(), torch.zeros(10, requires_grad=True)]
        params = weights + head

        def model(x):
            return torch.tanh(x @ weights[0] + weights[1]) @ head[0] + head[1]
    else:
        # an update of ~1.1 M parameters: long beside dlscope's own work at a step's end (~20 µs)
        model = nn.Sequential(nn.Linear(64, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 10))
        params = list(model.parameters())
    loss_fn = nn.functional.cross_entropy if args.mode == "bare_functional" else nn.CrossEntropyLoss()
    data = torch.utils.data.TensorDataset(torch.randn(1024, 64), torch.randint(0, 10, (1024,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
    if args.mode == "bare_functional":
        loader = list(loader)
    update_ms: list[float] = []
    correct = update_line = 0
    norms = 0.0
    while len(update_ms) < args.steps:
        for x, y in loader:
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            if args.mode == "metric":
                with torch.no_grad():
                    correct += int((out.argmax(1) == y).sum())
            if args.mode == "bare":
                nn.utils.clip_grad_norm_(params, 5.0)  # (torch runs it under no_grad: no update)
            if args.mode == "bare_read":
                norms += sum(float(p.data.norm()) for p in params)
            start = time.perf_counter()
            if args.mode in ("bare", "bare_set", "bare_functional"):
                for p in params:
                    if args.mode != "bare_set":
                        update_line = sys._getframe().f_lineno + 1  # the `.data` that starts the update
                        p.data.add_(p.grad, alpha=-0.01)
                    else:
                        update_line = sys._getframe().f_lineno + 1
                        p.data = p.data - 0.01 * p.grad
                    p.grad = None
                update_ms.append((time.perf_counter() - start) * 1e3)
                correct += int(loss.item() > 0)  # (a torch call after the update: not the update's)
            elif args.mode == "decorated":
                update_line = sys._getframe().f_lineno + 1  # the call of the decorated function
                sgd(params, 0.01)
            else:
                update_line = sys._getframe().f_lineno + 1  # the `with`
                with torch.no_grad():
                    for p in params:
                        if args.mode == "data":
                            p.data.add_(p.grad, alpha=-0.01)
                        else:
                            p -= 0.01 * p.grad
                        p.grad = None
            if args.mode not in ("bare", "bare_set", "bare_functional"):
                update_ms.append((time.perf_counter() - start) * 1e3)
            if len(update_ms) == args.steps:
                break
    each = ",".join(f"{ms:.4f}" for ms in update_ms)
    print(f"TRUTH steps={args.steps} update_line={update_line} step_update_ms={each} correct={correct}")


if __name__ == "__main__":
    main()
