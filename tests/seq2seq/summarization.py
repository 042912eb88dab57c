"""A run_summarization-shaped script, run by transformers' Seq2SeqTrainer or by raytrainer's (the import is the one
difference): a word-level tokenizer and documents made in code, a tiny T5 from its config, the script's
preprocessing and its compute_metrics, which decodes generated ids (the -100 padding replaced first, as the script
does). Nothing is downloaded."""

from __future__ import annotations

import numpy as np

VOCAB = 64
PAD, EOS, UNK = 0, 1, 2


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": UNK, **{f"w{i}": i for i in range(3, VOCAB)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def model():
    from tests.hf_models import tiny_model

    return tiny_model("t5", d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2)  # seeded: equal weights each call


def dataset(tok, rows: int = 7):
    """`rows` documents of 5..13 words, each summarised by its first half; tokenised as the script does. 7 rows
    on 2 workers in batches of 2: rank 1's last batch has one row (the uneven last shard)."""
    import datasets

    rng = np.random.default_rng(0)
    docs = [" ".join(f"w{i}" for i in rng.integers(3, VOCAB, rng.integers(5, 14))) for _ in range(rows)]
    summaries = [" ".join(d.split()[: len(d.split()) // 2]) for d in docs]

    def preprocess(batch):
        inputs = tok(batch["document"], max_length=16, truncation=True)
        inputs["labels"] = tok(text_target=batch["summary"], max_length=8, truncation=True)["input_ids"]
        return inputs

    raw = datasets.Dataset.from_dict({"document": docs, "summary": summaries})
    return raw.map(preprocess, batched=True, remove_columns=["document", "summary"])


def metrics_for(tok):
    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tok.pad_token_id)  # the script's own line
        decoded_preds = tok.batch_decode(preds, skip_special_tokens=True)
        labels = np.where(labels != -100, labels, tok.pad_token_id)
        decoded_labels = tok.batch_decode(labels, skip_special_tokens=True)
        overlap = [len(set(p.split()) & set(lab.split())) / max(1, len(set(lab.split())))
                   for p, lab in zip(decoded_preds, decoded_labels)]
        return {"overlap": float(np.mean(overlap)),
                "gen_len": float(np.mean([np.count_nonzero(p != tok.pad_token_id) for p in preds])),
                # weighs each decoded row by its position: rows out of dataset order change it
                "ordered_chars": float(sum(i * len(p) for i, p in enumerate(decoded_preds)))}

    return compute_metrics
