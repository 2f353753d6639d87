"""Training steps and a model's mode (prints the truth it knows):
forgot       model.eval() for validation after each epoch and no model.train() after it: every
             step from the second epoch on trains the model in eval mode
right        the same with model.train() at each epoch's start
adversarial  each step crafts its input with the model in eval mode, with grad (an FGSM attack),
             then trains it in train mode
teacher      a frozen teacher in eval mode, run with grad on, beside a student in train mode"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("forgot", "right", "adversarial", "teacher"))
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(320, 32), torch.randint(0, 4, (320,)))
    train, val = DataLoader(data, batch_size=32, shuffle=True), DataLoader(data, batch_size=64)
    model, teacher = net(), net().eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    in_eval_mode = []  # per step: did the model's forward run in eval mode
    model.train()
    for _ in range(3):
        if args.mode != "forgot":
            model.train()
        for x, y in train:
            if args.mode == "adversarial":
                model.eval()
                x = x.clone().requires_grad_(True)
                (grad,) = torch.autograd.grad(criterion(model(x), y), x)
                x = (x + 0.1 * grad.sign()).detach()
                model.train()
            in_eval_mode.append(not model.training)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            if args.mode == "teacher":
                loss = loss + (model(x) - teacher(x)).square().mean()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            sum(criterion(model(x), y).item() for x, y in val)
    first = in_eval_mode.index(True) if any(in_eval_mode) else -1
    print(f"TRUTH steps={len(in_eval_mode)} eval_mode_steps={sum(in_eval_mode)} first={first}")


if __name__ == "__main__":
    main()
