"""The hosted mode: any `transformers.Trainer` subclass, unmodified, on N Ray workers, with raytrainer's
checkpoints, resume, event stream and warm worker groups (docs/hosted.md).

- `raytrainer.hosted(SFTTrainer, num_workers=2)(model=..., args=SFTConfig(...), ...)`: the Python API (api.py);
- `raytrainer.launch("train.py", ["--lr", "1e-4"], num_workers=2)`, behind `raytrainer launch`
  (launch_script.py).

The driver's side is here: the options beside the trainer (options.py: `HostedOptions`, turned into the
coordinator's `RunSpec`), the driver's callbacks (callbacks.py), the answer to each Trainer's claim of its
output_dir (hosted_handler.py: `HostedHandler`), one order to the pool (dispatch_order.py). What runs on each
rank is worker/hosted/.
"""
