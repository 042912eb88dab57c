"""User code written the way the Hugging Face docs (and the project's seed documents) show it, imported by
the tests unchanged: a `CustomTrainer` with the old `compute_loss` signature and `model.device`, a DPO-style
trainer with a frozen reference model, and callbacks that return a dict of control flags."""

from __future__ import annotations

import torch
from torch import nn

from raytrainer import Trainer, TrainerCallback
from tests.hf_models import tiny_model

NUM_LABELS = 3


def tiny_classifier(seed: int = 0):
    """A real transformers sequence classifier from a config (nothing downloaded)."""
    return tiny_model("bert_classifier", seed, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, num_labels=NUM_LABELS)


class ClassificationData(torch.utils.data.Dataset):
    """Sequences of 6 tokens; the class is a function of the first token, so it can be learned."""

    def __init__(self, n: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 64, (n, 6), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(6, dtype=torch.long),
                "labels": int(self.ids[i, 0]) % NUM_LABELS}


class CustomTrainer(Trainer):
    """The HF docs' class-weighted loss, verbatim in shape: old signature, `model.device`, `self.model.config`."""

    def compute_loss(self, model, inputs, return_outputs=False):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        loss_fct = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0], device=model.device))
        loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
        return (loss, outputs) if return_outputs else loss


class DPOStyleTrainer(Trainer):
    """A frozen reference model and `beta` kept on the trainer; takes num_items_in_batch but returns a mean."""

    def __init__(self, *args, ref_model=None, beta: float = 0.1, **kwargs):
        super().__init__(*args, **kwargs)
        self.ref_model = ref_model
        self.beta = beta

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        with torch.no_grad():
            ref_logits = self.ref_model(input_ids=inputs["input_ids"],
                                        attention_mask=inputs["attention_mask"]).logits
        policy = outputs.logits.log_softmax(-1).gather(-1, labels[:, None]).squeeze(-1)
        ref = ref_logits.log_softmax(-1).gather(-1, labels[:, None]).squeeze(-1)
        loss = -nn.functional.logsigmoid(self.beta * (policy - ref) + policy).mean()
        return (loss, outputs) if return_outputs else loss


class StopAtStep(TrainerCallback):
    """The seed's early stop: return a dict of control flags from on_step_end."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            return {"should_training_stop": True}
