"""FSDP2 on real Ray Train worker groups (gloo on CPU): the same run as DDP, step for step."""

import pytest

from tests.blocks_model import train_blocks
from tests.models import assert_same_weights, weights

pytestmark = pytest.mark.usefixtures("ray_session")


def test_two_worker_fsdp_ends_where_two_worker_ddp_does(tmp_path):
    """AdamW, clipping that engages (max_grad_norm 0.5), accumulation 2: the clipped norm is computed over
    DTensor shards, and accumulation skips the reduce-scatter on the first micro-step."""
    ddp = train_blocks(str(tmp_path / "ddp"), strategy="ddp", gradient_accumulation_steps=2)
    fsdp = train_blocks(str(tmp_path / "fsdp"), fsdp="full_shard auto_wrap", gradient_accumulation_steps=2)
    assert fsdp.args.strategy == "fsdp"
    assert_same_weights(weights(fsdp.model), weights(ddp.model))
    norms = lambda t: [h["grad_norm"] for h in t.state.log_history if "grad_norm" in h]  # noqa: E731
    assert len(norms(fsdp)) == 6 and max(norms(ddp)) > 0.5  # clipping was active
    assert norms(fsdp) == pytest.approx(norms(ddp), rel=1e-4)
