"""A training script as a user runs it under torchrun: transformers' own Trainer on a tiny Llama built from a
config, data made in code. It knows nothing of raytrainer; the hosted-mode tests run it with `raytrainer
launch` (and `raytrainer.launch`) and kill what a failure would.

    python plain_script.py --output_dir DIR --results RES [--max_steps 8] [--save_steps 3]
                           [--kill_rank 1 --kill_at 5 --kill_marker FILE]
                           [--pause_at 4 --pause_s 30 --pause_marker FILE]
                           [--hang_at 5 --hang_s 600 --hang_marker FILE]

Rank 0 writes RES/log_history.json and RES/weights.safetensors at the end. `--kill_*`: that rank dies (SIGKILL)
at the end of step `kill_at`, once (the marker file remembers). `--pause_*`: rank 0 sleeps as that step's
checkpoint is saved (a test kills the driver or a node meanwhile), once if a marker file is given. `--hang_*`:
rank `kill_rank` sleeps in a callback at the end of step `hang_at`, once (the marker file remembers): a hung
rank."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int = 64):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(3, 64, (12,), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


class Faults(TrainerCallback):
    def __init__(self, options):
        self.options = options

    def on_step_end(self, args, state, control, **kwargs):
        o = self.options
        if o.kill_at == state.global_step and int(os.environ.get("RANK", 0)) == o.kill_rank \
                and not os.path.exists(o.kill_marker):
            open(o.kill_marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if o.hang_at == state.global_step and int(os.environ.get("RANK", 0)) == o.kill_rank \
                and not os.path.exists(o.hang_marker):
            open(o.hang_marker, "w").close()
            time.sleep(o.hang_s)  # the hung line

    def on_save(self, args, state, control, **kwargs):
        o = self.options
        if o.pause_at == state.global_step and int(os.environ.get("RANK", 0)) == 0 and \
                not os.path.exists(o.pause_marker or ""):
            if o.pause_marker:
                open(o.pause_marker, "w").close()
            time.sleep(o.pause_s)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", "--out", required=True)  # --out: a name the driver does not read
    parser.add_argument("--results", required=True)
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--save_steps", type=int, default=3)
    parser.add_argument("--kill_rank", type=int, default=1)
    parser.add_argument("--kill_at", type=int, default=-1)
    parser.add_argument("--kill_marker", default="")
    parser.add_argument("--pause_at", type=int, default=-1)
    parser.add_argument("--pause_s", type=float, default=0)
    parser.add_argument("--pause_marker", default="")  # given: the pause happens once
    parser.add_argument("--hang_at", type=int, default=-1)
    parser.add_argument("--hang_s", type=float, default=0)
    parser.add_argument("--hang_marker", default="")
    parser.add_argument("--built_marker", default="")  # written once the Trainer is built
    options = parser.parse_args()
    model = tiny_llama()
    args = TrainingArguments(output_dir=options.output_dir, max_steps=options.max_steps, save_steps=options.save_steps,
                             per_device_train_batch_size=2, logging_steps=1, learning_rate=1e-3, seed=42,
                             report_to="none", disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Faults(options)])
    if options.built_marker:
        open(options.built_marker, "w").close()
    trainer.train()
    write_results(trainer, options.results)


def stops_arguments(output_dir: str, max_steps: int) -> TrainingArguments:
    """stops_script.py's arguments (and the Python API's Ctrl-C test's): a constant learning rate and no periodic
    checkpoint before the last step, so that a stop's checkpoint is the only one."""
    return TrainingArguments(output_dir=output_dir, max_steps=max_steps, save_steps=1000,
                             per_device_train_batch_size=2, logging_steps=1, learning_rate=1e-3, seed=42,
                             lr_scheduler_type="constant", report_to="none", disable_tqdm=True,
                             use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0)


def tiny_llama(**config) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        **config))


def write_results(trainer, results: str):
    """Rank 0: RESULTS/log_history.json and RESULTS/weights.safetensors, what the tests compare."""
    if trainer.is_world_process_zero():
        save_results(trainer.state.log_history, trainer.model, results)


def save_results(log_history: list, model, results: str):
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "log_history.json"), "w") as f:
        json.dump(log_history, f)
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
              os.path.join(results, "weights.safetensors"))


if __name__ == "__main__":
    main()
