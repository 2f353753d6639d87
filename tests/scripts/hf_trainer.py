"""The Hugging Face Trainer (through accelerate) on a tiny GPT-2 config, synthetic tokens: a few
steps, an evaluation and a checkpoint every `--every` steps. Under torchrun each rank is a DDP
rank on gloo. Each rank prints the truth the Trainer itself knows."""

import argparse
import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n: int, length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Truth(TrainerCallback):
    def __init__(self) -> None:
        self.evaluations = self.saves = 0

    def on_evaluate(self, args, state, control, **kwargs) -> None:
        self.evaluations += 1

    def on_save(self, args, state, control, **kwargs) -> None:
        self.saves += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    truth = Truth()
    training = TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        eval_strategy="steps",
        eval_steps=args.every,
        save_steps=args.every,
        logging_steps=args.every,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=args.workers,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=Tokens(256, 32, 128, 0),
        eval_dataset=Tokens(16, 32, 128, 1),
        callbacks=[truth],
    )
    trainer.train()
    rank = training.process_index
    files = []
    if trainer.is_world_process_zero():
        for d in sorted(os.listdir(args.out)):
            if d.startswith("checkpoint-"):
                files += [os.path.join(args.out, d, f) for f in ("model.safetensors", "optimizer.pt")]
    print(
        f"TRUTH rank={rank} steps={trainer.state.global_step} evaluations={truth.evaluations} "
        f"saves={truth.saves} files={','.join(files)}",  # every rank saves (its own RNG state at least)
        flush=True,
    )


if __name__ == "__main__":
    main()
