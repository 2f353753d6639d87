"""pytorch/examples mnist/main.py (commit 77f55b9), unchanged but for its data: torchvision does not
import here, so `datasets.MNIST` and its transforms are replaced by what they do per sample —
the uint8 image to a PIL image, ToTensor (to float in [0, 1]), Normalize((0.1307,), (0.3081,)) —
over the MNIST that dlscope ships. No accelerator here: CPU, no workers, as upstream runs on a CPU."""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from PIL import Image
from torch.optim.lr_scheduler import StepLR

import dlscope


class MNIST(torch.utils.data.Dataset):
    """torchvision.datasets.MNIST's __getitem__ with ToTensor and Normalize, on dlscope's copy."""

    def __init__(self, train: bool) -> None:
        mnist = dlscope.load_mnist()
        self.images = mnist.train_images if train else mnist.test_images
        self.labels = mnist.train_labels if train else mnist.test_labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        img = Image.fromarray(self.images[index].numpy(), mode="L")
        x = torch.from_numpy(np.array(img, np.uint8, copy=True)).view(1, 28, 28).float().div(255)
        return (x - 0.1307) / 0.3081, int(self.labels[index])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} "
                f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}"
            )
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)}\n")


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N")
    parser.add_argument("--epochs", type=int, default=14, metavar="N")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--save-model", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    train_loader = torch.utils.data.DataLoader(MNIST(train=True), batch_size=args.batch_size)
    test_loader = torch.utils.data.DataLoader(MNIST(train=False), batch_size=args.test_batch_size)
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()
    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
