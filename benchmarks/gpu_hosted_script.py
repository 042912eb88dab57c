"""The plain `transformers.Trainer` script that benchmarks/gpu.py times under torchrun and under `raytrainer launch`:
a Llama built from a config, random token rows made in code (a torch Dataset: the GPU machine has no HF
`datasets`), bf16 on a GPU. It knows nothing of raytrainer. `--fsdp`: HF's own `fsdp="full_shard"` (accelerate's
FSDP; GPU only). `--stamps FILE`: rank 0 writes the wall-clock times of the script's start, of train begin and of
every step end (hosted_sft.py's format), with what may make the same script slower under one launcher (threads,
switch interval, determinism, accelerate's mode) and, with `--profile N`, a torch.profiler summary of the last N
steps (gpu_loops.StepProfile: kernels, the device's busy share, the host's waits on it)."""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: under either launcher, what the script itself costs

import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make_step_stamps_callback, timed_script_parser  # noqa: E402
from fsdp import TokenRows  # noqa: E402  (random token rows, generated per index from the seed)
from gpu_loops import StepProfile, process_facts  # noqa: E402

SIZES = {  # name: (LlamaConfig fields, sequence length, batch per process)
    "gpu": (dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                 num_attention_heads=12, num_key_value_heads=4), 512, 8),
    "smoke": (dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2), 32, 4),
}


def main():
    parser = timed_script_parser()
    parser.add_argument("--size", choices=sorted(SIZES), default="gpu")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--profile", type=int, default=0, help="profile the last N steps (rank 0)")
    options = parser.parse_args()
    fields, seq, batch = SIZES[options.size]
    gpu = torch.cuda.is_available()
    rows = TokenRows(types.SimpleNamespace(samples=options.max_steps * batch * 8, seq=seq, vocab=fields["vocab_size"],
                                           seed=42))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**fields, max_position_embeddings=seq, use_cache=False,
                                         attn_implementation="sdpa"))
    fsdp = dict(fsdp="full_shard", fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}) \
        if options.fsdp else {}
    args = TrainingArguments(output_dir=options.output_dir, max_steps=options.max_steps,
                             per_device_train_batch_size=batch, logging_steps=10, save_strategy="no",
                             report_to="none", disable_tqdm=True, learning_rate=3e-4, seed=42, use_cpu=not gpu,
                             bf16=gpu, dataloader_num_workers=0, **fsdp)
    watch = Watch(options.max_steps, options.profile)
    stamps = make_step_stamps_callback(options.stamps, STARTED, extra=watch.facts)
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[watch, stamps])
    watch.trainer = trainer
    trainer.train()


class Watch(TrainerCallback):
    """Rank 0's facts of the run, at its middle step (threads are up), the CPU its loop's thread and its process
    spent a step against the step's wall time (from the first fifth of the steps to the last: a thread that
    waits, for the GIL or for a core, shows as wall time without CPU time), the loop thread's context switches a
    step (voluntary: it blocked, on the GIL, a lock or the device; involuntary: preempted for another runnable
    thread), and the profile of its last steps."""

    def __init__(self, max_steps: int, profile_steps: int):
        self.middle, self.first, self.trainer, self.process = max_steps // 2, max_steps // 5, None, None
        self.clocks, self.cpu = None, None
        self.profile = StepProfile(max_steps - profile_steps, profile_steps, torch.device(
            "cuda" if torch.cuda.is_available() else "cpu"))

    def on_step_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.profile.step(state.global_step)
            if state.global_step == self.first:
                self.clocks = (state.global_step, time.perf_counter(), time.thread_time(), time.process_time(),
                               resource.getrusage(resource.RUSAGE_THREAD))
            if state.global_step == self.middle:
                self.process = process_facts()

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.clocks and state.global_step == state.max_steps:
            step, wall, thread, process, usage = self.clocks
            n, now = state.global_step - step, resource.getrusage(resource.RUSAGE_THREAD)
            self.cpu = {"wall_ms": 1e3 * (time.perf_counter() - wall) / n,
                        "loop_thread_cpu_ms": 1e3 * (time.thread_time() - thread) / n,
                        "process_cpu_ms": 1e3 * (time.process_time() - process) / n, "steps": n,
                        "loop_thread_blocked": (now.ru_nvcsw - usage.ru_nvcsw) / n,
                        "loop_thread_preempted": (now.ru_nivcsw - usage.ru_nivcsw) / n}

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.profile.step(state.global_step)

    def facts(self) -> dict:
        accelerator = getattr(self.trainer, "accelerator", None)
        return {"process": self.process, "profile": self.profile.summary, "cpu_per_step": self.cpu,
                "parallel_mode": str(self.trainer.args.parallel_mode),
                "distributed_type": str(getattr(accelerator, "distributed_type", None))}


if __name__ == "__main__":
    main()
