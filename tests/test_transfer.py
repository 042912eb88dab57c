"""Weights and data travel once, through Ray's object store, not inside the pickled trainer (transfer.py).

The pickle's size does not grow with the model; what arrives is what was sent (tied weights stay tied,
buffers persistent or not, bf16, the identity of parameters an optimizer holds); datasets travel out of
the pickle (an in-memory `datasets.Dataset` as its Arrow buffers, a memory-mapped one as its files' paths);
and a 2-worker run of a subclass with a second module and an Arrow dataset ends as the in-process run does.
"""

import hashlib
import os

import datasets
import numpy as np
import pytest
import torch
from torch import nn

from raytrainer import ConfigError, Trainer, TrainingArguments, transfer
from raytrainer.protocol import TrainOrder
from tests.hf_models import tiny_model
from tests.models import VOCAB, TokenData, assert_same_weights, make_model, weights


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), num_workers=0, max_steps=2, disable_tqdm=True,
                save_strategy="no")
    return TrainingArguments(**{**base, **kw})


class TiedLM(nn.Module):
    """Embedding and output head share one Parameter (as HF's tied LMs); a persistent buffer updated in place
    by forward (a count of training forwards, the same on every rank); a non-persistent buffer; a bf16 one."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("forwards", torch.zeros((), dtype=torch.int64))
        self.register_buffer("scale", torch.full((dim,), 0.5), persistent=False)
        self.register_buffer("low", torch.arange(4, dtype=torch.bfloat16))

    def forward(self, input_ids, attention_mask=None, labels=None, idx=None):
        hidden = self.norm(self.emb(input_ids)) * (1 + self.scale)
        if self.training:
            self.forwards.add_(1)
        logits = self.head(hidden)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return out


def make_tied(seed: int = 0, dim: int = 16) -> TiedLM:
    torch.manual_seed(seed)
    return TiedLM(dim)


# --------------------------------------------------------------------------------------- what is pickled
def test_the_pickled_trainer_does_not_grow_with_the_model(tmp_path):
    sizes = {}
    for dim in (16, 1024):
        trainer = Trainer(model=make_tied(dim=dim), args=args(tmp_path), train_dataset=TokenData(8))
        packed = transfer.pack_job(trainer, TrainOrder(run_id="test"))
        sizes[dim] = (len(packed.payload), packed.nbytes())
    assert sizes[1024][1] > 50 * sizes[16][1]  # the weights grew 64-fold, and went out of band
    assert sizes[1024][1] >= (VOCAB * 1024 + 1024 * 3) * 4
    assert abs(sizes[1024][0] - sizes[16][0]) < 64          # the pickle did not (a few digits of shapes)


def test_round_trip_keeps_ties_buffers_dtypes_and_parameter_identity():
    model = make_tied()
    model.forwards.add_(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # holds the same Parameters as the model
    packed = transfer.pack({"model": model, "optimizer": optimizer})
    out = transfer.unpack(packed.payload, packed.data)
    copy = out["model"]
    assert copy.head.weight is copy.emb.weight and isinstance(copy.emb.weight, nn.Parameter)
    assert copy.emb.weight.requires_grad and copy.low.dtype == torch.bfloat16
    torch.testing.assert_close(copy.scale, model.scale)    # non-persistent: not in the state dict, yet kept
    assert_same_weights(weights(copy), weights(model))
    assert {id(p) for p in out["optimizer"].param_groups[0]["params"]} == {id(p) for p in copy.parameters()}
    # The worker trains its module tensors: its own memory, not a view of what was sent.
    for name, tensor in copy.state_dict().items():
        assert tensor.data_ptr() != model.state_dict()[name].data_ptr(), name
    copy.forwards.add_(1)
    assert int(copy.forwards) == 4 and int(model.forwards) == 3


def test_large_data_tensors_are_out_of_band_and_not_copied():
    rows = torch.randn(50_000, 4)  # 800 KB: out of the pickle
    small = torch.arange(10)       # stays inside
    packed = transfer.pack({"rows": rows, "small": small})
    assert len(packed.payload) < 4096 and len(packed.tensors) == 1
    out = transfer.unpack(packed.payload, packed.data)
    assert torch.equal(out["rows"], rows) and torch.equal(out["small"], small)
    assert out["rows"].data_ptr() == packed.tensors[0].ctypes.data  # a view of the shipped array


def test_in_memory_arrow_dataset_travels_as_buffers_and_memory_mapped_one_as_paths(tmp_path):
    ids = np.random.default_rng(0).integers(0, VOCAB, size=(4000, 8)).tolist()
    in_memory = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    packed = transfer.pack(in_memory)
    assert packed.nbytes() >= 4000 * 8 * 8 and len(packed.payload) < packed.nbytes() / 2
    arrived = transfer.unpack(packed.payload, packed.data)
    assert arrived[:] == in_memory[:]

    in_memory.save_to_disk(str(tmp_path / "ds"))
    mapped = datasets.load_from_disk(str(tmp_path / "ds"))
    packed = transfer.pack(mapped)
    assert packed.nbytes() == 0 and len(packed.payload) < 64 * 1024  # the cache files' paths, not the rows
    assert transfer.unpack(packed.payload, packed.data)[:] == in_memory[:]



def test_a_ray_dataset_travels_beside_the_pickle_for_rays_own_serializer(ray_session):
    import ray

    from raytrainer.data.ray_data import make_ref

    dataset = ray.data.range(8, override_num_blocks=2).materialize()  # block references: Ray must count them
    ref = make_ref("train", dataset, split=True)
    packed = transfer.pack({"train_dataset": ref})
    assert packed.ray_datasets == [dataset] and b"ObjectRef" not in packed.payload
    arrived = ray.get(ray.put(packed.data))  # as a worker gets it
    row_ids = transfer.unpack(packed.payload, arrived)["train_dataset"].dataset.to_pandas()["id"].tolist()
    assert row_ids == list(range(8))


# -------------------------------------------------------------------------------------------- on Ray
class RefTrainer(Trainer):
    """A subclass with a second module (a frozen reference model, as in distillation or DPO) that travels
    with the trainer, and a record of the dataset each worker received."""

    digest_dir = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        self.ref_model.to(loss.device)
        with torch.no_grad():
            ref = self.ref_model(inputs["input_ids"])["logits"].log_softmax(-1)
        logp = outputs["logits"].log_softmax(-1)
        kl = (logp.exp() * (logp - ref)).sum(-1)[inputs["labels"] != -100].sum()
        loss = loss + 0.1 * kl / num_items_in_batch  # normalised over the global batch, as the loss is
        return (loss, outputs) if return_outputs else loss

    def get_train_dataloader(self):
        with open(os.path.join(self.digest_dir, f"rank{self.ctx.rank}.txt"), "w") as f:
            f.write(dataset_digest(self.train_dataset))
        return super().get_train_dataloader()


def dataset_digest(dataset) -> str:
    return hashlib.sha256(repr([dataset[i] for i in range(len(dataset))]).encode()).hexdigest()


def arrow_dataset(n: int = 2048) -> datasets.Dataset:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, size=(n, 6))
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": ((ids + 1) % VOCAB).tolist()})


def train_ref(tmp_path, num_workers: int):
    digest_dir = tmp_path / f"digest{num_workers}"
    digest_dir.mkdir()
    trainer = RefTrainer(model=make_tied(seed=0), train_dataset=arrow_dataset(),
                         args=args(tmp_path, num_workers=num_workers,
                                   per_device_train_batch_size=8 // max(num_workers, 1),
                                   max_steps=4, learning_rate=1e-2, seed=3, optim="adamw_torch",
                                   output_dir=str(tmp_path / f"out{num_workers}")))
    trainer.ref_model = make_tied(seed=1).eval()  # frozen, as a reference model is
    trainer.digest_dir = str(digest_dir)
    trainer.train()
    return trainer, digest_dir


@pytest.mark.usefixtures("ray_session")
def test_two_workers_from_the_object_store_end_as_in_process(tmp_path):
    local, _ = train_ref(tmp_path, num_workers=0)
    two, digests = train_ref(tmp_path, num_workers=2)
    # The trained weights came back through the object store: equal to the in-process run's, the
    # buffer updated by forward included, and the driver's model is still tied.
    assert_same_weights(weights(two.model), weights(local.model))
    assert int(two.model.forwards) == 4  # one per step: the driver's 2-sample check leaves buffers as they were
    assert two.model.head.weight is two.model.emb.weight
    assert_same_weights(weights(two.ref_model), weights(make_tied(seed=1)))  # the driver's copy is untouched
    # The Arrow dataset arrived intact on every worker.
    expected = dataset_digest(arrow_dataset())
    assert sorted(p.read_text() for p in digests.iterdir()) == [expected, expected]


def test_hf_model_round_trip_keeps_its_tied_head_and_non_persistent_buffers():
    pytest.importorskip("transformers")
    model = tiny_model("gpt2", vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                       resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1).eval()  # no dropout: the forwards agree
    packed = transfer.pack(model)
    assert len(packed.payload) < 64 * 1024
    copy = transfer.unpack(packed.payload, packed.data)
    assert copy.lm_head.weight is copy.transformer.wte.weight
    assert_same_weights(weights(copy), weights(model))
    for (name, a), (_, b) in zip(model.named_buffers(), copy.named_buffers()):  # persistent or not
        torch.testing.assert_close(a, b, msg=name)
    ids = torch.randint(0, VOCAB, (2, 8))
    torch.testing.assert_close(copy(ids, labels=ids).loss, model(ids, labels=ids).loss)


def test_an_eval_dataset_that_cannot_be_serialised_is_named(tmp_path):
    import threading

    data = TokenData(4)
    data.lock = threading.Lock()  # not picklable
    trainer = Trainer(model=make_model(), args=args(tmp_path))
    with pytest.raises(ConfigError, match="The dataset cannot be sent to the workers.*picklable"):
        trainer.evaluate(eval_dataset=data)
