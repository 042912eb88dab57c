"""The hosted mode: any `transformers.Trainer` subclass, unmodified, on N Ray workers, with raytrainer's
checkpoints, resume, event stream and warm worker groups (docs/hosted.md).

- `raytrainer.hosted(SFTTrainer, num_workers=2)(model=..., args=SFTConfig(...), ...)`: the Python API (api.py);
- `raytrainer.launch("train.py", ["--lr", "1e-4"], num_workers=2)`, behind `raytrainer launch` (launch.py).

The driver's side is here (options.py, claims.py, run.py); what runs on each rank is worker/hosted/.
"""
