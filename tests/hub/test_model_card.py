"""`Trainer.create_model_card` (raytrainer/hub/model_card.py): transformers' card, written through fsspec (local
and S3); a second card keeps the first one's tags."""

import yaml

from raytrainer import Trainer, TrainingArguments
from raytrainer.storage import read_text
from tests.models import TokenData, make_model


def test_create_model_card_writes_transformers_card_through_fsspec(output_url):
    output_dir, options = output_url
    args = TrainingArguments(output_dir=output_dir, storage_options=options, num_workers=0, max_steps=2,
                             logging_steps=1, eval_strategy="steps", eval_steps=1, save_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(16), eval_dataset=TokenData(4))
    trainer.train()
    trainer.create_model_card(language="en", license="apache-2.0", tags="demo", finetuned_from="org/base",
                              tasks="text-generation", dataset="toy")
    trainer.create_model_card(model_name="tiny", tags=["more"])  # a second card keeps the first one's tags
    text = read_text(output_dir.rstrip("/") + "/README.md", options)
    metadata = yaml.safe_load(text.split("---")[1])
    assert metadata["tags"] == ["more", "generated_from_trainer", "demo"]
    assert metadata["model-index"][0]["name"] == "tiny"
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["type"] == "loss"
    assert "# tiny" in text and "| Training Loss | Epoch | Step | Validation Loss |" in text
    assert "- total_train_batch_size" not in text and "- train_batch_size: 8" in text
