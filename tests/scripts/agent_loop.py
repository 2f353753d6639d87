"""A reinforcement-learning agent's loop, shaped as stable-baselines3's DQN runs it (prints the
truth it knows): at each update the policy acts for a few environment steps in eval mode under
no_grad (`set_training_mode(False)`), then trains in train mode on a batch from its replay buffer,
with a target network's forward under no_grad."""

import argparse
import time

import torch
from torch import nn

ACTIONS_PER_UPDATE = 4  # SB3's train_freq


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    steps = parser.parse_args().steps
    torch.manual_seed(0)
    q, target = (
        nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2)),
        nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2)),
    )
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-3)
    replay = torch.randn(4096, 8)
    state, act_s = torch.randn(1, 8), 0.0
    for _ in range(steps):
        q.train(False)  # collect_rollouts
        start = time.perf_counter()
        for _ in range(ACTIONS_PER_UPDATE):
            with torch.no_grad():
                action = q(state).argmax(1)
            state = torch.tanh(state + 0.1 * action)  # the environment
        act_s += time.perf_counter() - start
        q.train(True)  # train()
        batch = replay[torch.randint(0, len(replay), (32,))]
        with torch.no_grad():
            goal = target(batch).max(1).values
        loss = nn.functional.smooth_l1_loss(q(batch).max(1).values, goal)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"TRUTH steps={steps} act_ms={1e3 * act_s:.3f}")


if __name__ == "__main__":
    main()
