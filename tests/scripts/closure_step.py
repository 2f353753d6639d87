"""`optimizer.step(closure)` with forward and backward inside the closure, fed by a DataLoader;
a checkpoint saved and loaded back at the end (the load under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD,
whose UserWarning must point at this file's line). Prints the truth it knows."""

import argparse
import os
import sys
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.n, 32)
    y = (x.sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 0
    for inputs, labels in loader:

        def closure(inputs: torch.Tensor = inputs, labels: torch.Tensor = labels) -> torch.Tensor:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            return loss

        optimizer.step(closure)
        steps += 1
    path = os.path.join(args.out, "model.pt")
    torch.save(model.state_dict(), path)
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        model.load_state_dict(torch.load(path))
    where = [f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught if w.category is UserWarning]
    print(f"TRUTH steps={steps} saves=1 loads=1 warning_line=closure_step.py:{line} warnings_at={','.join(where)}")


if __name__ == "__main__":
    main()
