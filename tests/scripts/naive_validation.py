"""A loop that validates after each epoch (prints the truth it knows), in one of three styles:
neither       neither `model.eval()` nor `torch.no_grad()` (a student's): its forwards are training forwards
eval-grad     `model.eval()` without `torch.no_grad()`: the loss module's forward is in train mode, with grad
eval-no-grad  both, as the PyTorch tutorials write it
per-batch     both, set by each batch's step function after the batch is drawn, the training one
              inside `optimizer.step(closure)` (skorch's loop: the validation's first batch is drawn in
              train mode, the next epoch's first training batch in eval mode)
then, last, one pass of a loss summed over four batches before a single backward() (and an
optimizer step), which is training, not an evaluation. Each loader's batches are drawn through
`drawn`, which notes when each pass's iter() and first draw began on dlscope's clock
(time.time()): a validation pass as dlscope bounds it is known exactly (val_span_ms), whatever the
machine's load puts between — after model.eval(), from its loader's iter() (its pass's start) to
the next training pass's (model.train() right before it); found from its batches (neither), from
its first batch's draw to the next training batch's; drawn in train mode (per-batch), from its
first batch's draw to the next training pass's iter(), which the next epoch's first batch, drawn
in eval mode, takes with it."""

import argparse
import contextlib
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 3


def drawn(loader, passes: list[tuple[float, float]]):
    """The loader's batches; when its iter() and the draw of its first batch began, appended to
    `passes`."""
    started = time.time()
    it = iter(loader)
    first = True
    while True:
        began = time.time()
        try:
            batch = next(it)
        except StopIteration:
            return
        if first:
            passes.append((started, began))
            first = False
        yield batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--style", choices=("neither", "eval-grad", "eval-no-grad", "per-batch"), default="neither")
    style = parser.parse_args().style
    torch.manual_seed(0)
    train = DataLoader(TensorDataset(torch.randn(1280, 64), torch.randint(0, 10, (1280,))), batch_size=64, shuffle=True)
    val = DataLoader(TensorDataset(torch.randn(2560, 64), torch.randint(0, 10, (2560,))), batch_size=64)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    forward_s, val_s, steps = 0.0, [], 0  # the training forwards (model and loss), each validation pass
    train_draws, val_draws = [], []  # when each pass began: its iter(), its first draw
    if style == "per-batch":
        forward_s, val_s, steps = per_batch(train, val, model, optimizer, criterion, train_draws, val_draws)
    for _ in range(EPOCHS if style != "per-batch" else 0):
        if style != "neither":
            model.train()
        for x, y in drawn(train, train_draws):
            optimizer.zero_grad()
            start = time.perf_counter()
            loss = criterion(model(x), y)
            forward_s += time.perf_counter() - start
            loss.backward()
            optimizer.step()
            steps += 1
        start = time.perf_counter()
        if style != "neither":
            model.eval()
        with torch.no_grad() if style == "eval-no-grad" else contextlib.nullcontext():
            total = sum(criterion(model(x), y).item() for x, y in drawn(val, val_draws))
        val_s.append(time.perf_counter() - start)
        print(f"validation loss {total / len(val):.3f}")
    model.train()
    criterion.train()  # (per-batch put it in eval mode too)
    optimizer.zero_grad()
    summed = None
    for n, (x, y) in enumerate(drawn(train, train_draws)):  # four batches, each fed to a forward, then one backward
        start = time.perf_counter()
        loss = criterion(model(x), y)
        forward_s += time.perf_counter() - start
        summed = loss if summed is None else summed + loss
        if n == 3:
            break
    summed.backward()
    optimizer.step()
    steps += 1
    val_ms = ",".join(f"{1e3 * s:.3f}" for s in val_s)
    # each validation pass to the next training pass, as dlscope bounds them (the module's text)
    begins = [started if style.startswith("eval-") else first for started, first in val_draws]
    ends = [first if style == "neither" else started for started, first in train_draws[1:]]
    spans = ",".join(f"{1e3 * (t - v):.3f}" for v, t in zip(begins, ends, strict=True))
    print(
        f"TRUTH steps={steps} forward_ms={1e3 * forward_s:.3f} val_ms={val_ms} val_span_ms={spans}",
        f"val_batches={EPOCHS * len(val)}",
    )


def per_batch(train, val, model, optimizer, criterion, train_draws, val_draws) -> tuple[float, list[float], int]:
    """skorch's fit loop: (training forwards' seconds, each validation pass's, steps)."""
    forward_s, val_s, steps = 0.0, [], 0
    for _ in range(EPOCHS):
        for x, y in drawn(train, train_draws):

            def closure(x=x, y=y) -> torch.Tensor:
                nonlocal forward_s
                start = time.perf_counter()  # a closure's time up to its backward is the step's forward
                model.train()  # skorch's _set_training(True): the module, then the loss module
                criterion.train()
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                forward_s += time.perf_counter() - start
                loss.backward()
                return loss

            optimizer.step(closure)
            steps += 1
        start, total = time.perf_counter(), 0.0
        for x, y in drawn(val, val_draws):
            model.eval()
            criterion.eval()
            with torch.no_grad():
                total += criterion(model(x), y).item()
        val_s.append(time.perf_counter() - start)
        print(f"validation loss {total / len(val):.3f}")
    return forward_s, val_s, steps


if __name__ == "__main__":
    main()
