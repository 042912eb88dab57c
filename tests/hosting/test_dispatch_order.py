"""What the hosted mode checks of a call before it is sent to the workers (raytrainer/hosting/dispatch_order.py):
datasets read from this node's disk cannot travel to workers elsewhere."""

from __future__ import annotations

import pytest

from raytrainer.errors import ConfigError
from tests.hosting.test_api import TeamTrainer


def test_a_dataset_on_this_nodes_disk_is_refused_when_workers_may_be_elsewhere(tmp_path):
    from datasets import Dataset, load_from_disk

    from raytrainer.hosting.dispatch_order import check_datasets_travel
    from raytrainer.protocol import HostedCall

    Dataset.from_dict({"text": ["a b", "c d"]}).save_to_disk(str(tmp_path / "ds"))
    mapped = load_from_disk(str(tmp_path / "ds"))
    with pytest.raises(ConfigError, match=r"train_dataset is a datasets.Dataset read from this node's disk .*"
                                          r"keep_in_memory=True"):
        check_datasets_travel(HostedCall(TeamTrainer, (), {"train_dataset": mapped}))
    with pytest.raises(ConfigError, match="call argument 0 is a datasets.Dataset"):
        check_datasets_travel(HostedCall(TeamTrainer, (), {}, call_args=(mapped,)))
    in_memory = load_from_disk(str(tmp_path / "ds"), keep_in_memory=True)
    check_datasets_travel(HostedCall(TeamTrainer, (), {"train_dataset": in_memory, "eval_dataset": {"a": in_memory}}))
