"""Every `optim` and `lr_scheduler_type` name raytrainer implements, once. `TrainingArguments` checks against
them and lists them in its help; the builders (`builtin.py`, `registry.py`, `schedules`) implement them."""

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "polynomial")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor", "schedule_free_adamw", "schedule_free_sgd",
              "schedule_free_radam",
              # their own packages (registry.py): pip extras galore, apollo, lomo, grokadamw, stable-adamw
              "galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
              "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "apollo_adamw", "apollo_adamw_layerwise",
              "lomo", "adalomo", "grokadamw", "stable_adamw")
