"""ProfilerCallback in the driver process (num_workers=0): a Chrome trace and a summary per rank under
output_dir/profile/, locally and on S3 (moto); the summary printed; the CUDA memory snapshot refused with a
warning on CPU. On 2 Ray workers: tests/integration/test_throughput_on_ray.py."""

import json
import os

import pytest

from raytrainer import ProfilerCallback, Trainer, TrainingArguments
from tests.models import TokenData, make_model


def train(output_dir, callback, max_steps=4, **overrides):
    args = TrainingArguments(output_dir=output_dir, num_workers=0, per_device_train_batch_size=4,
                             max_steps=max_steps, logging_steps=1, save_strategy="no", disable_tqdm=True, **overrides)
    Trainer(model=make_model(), args=args, train_dataset=TokenData(40), callbacks=[callback]).train()


def check_trace(text: str):
    trace = json.loads(text)
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("aten::" in n for n in names), sorted(names)[:20]  # the operators of the profiled steps


def test_trace_and_summary_of_the_profiled_steps(tmp_path, capsys):
    train(str(tmp_path), ProfilerCallback(start_step=2, end_step=3))
    folder = tmp_path / "profile" / "steps_2-3"
    assert sorted(os.listdir(folder)) == ["rank0.summary.txt", "rank0.trace.json"]
    check_trace((folder / "rank0.trace.json").read_text())
    summary = (folder / "rank0.summary.txt").read_text()
    assert "Self CPU" in summary and "aten::" in summary
    assert "profile of steps 2-3" in capsys.readouterr().out  # rank 0's table on the driver's console


def test_a_run_ending_inside_the_range_writes_what_it_profiled(tmp_path):
    with pytest.warns(UserWarning, match="GPU-only"):
        train(str(tmp_path), ProfilerCallback(start_step=3, end_step=10, memory_snapshot=True))
    folder = tmp_path / "profile" / "steps_3-4"
    assert sorted(os.listdir(folder)) == ["rank0.summary.txt", "rank0.trace.json"]  # no snapshot on CPU


def test_s3_output_dir(tmp_path, s3_server, s3_bucket):
    import s3fs

    opts = dict(s3_server.storage_options)
    train(s3_bucket + "/run", ProfilerCallback(1, 1), max_steps=1, storage_options=opts)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    folder = s3_bucket + "/run/profile/steps_1-1"
    assert sorted(os.path.basename(f) for f in fs.ls(folder)) == ["rank0.summary.txt", "rank0.trace.json"]
    check_trace(fs.cat(folder + "/rank0.trace.json").decode())


@pytest.mark.parametrize("start, end", [(0, 2), (3, 2), (1.5, 2)])
def test_bad_steps_name_the_fix(start, end):
    with pytest.raises(ValueError, match="1 <= start_step <= end_step"):
        ProfilerCallback(start, end)
