"""Checkpoints: what a run writes to storage, when it counts (committed), and what a run resumes from.

    snapshot.py       what a checkpoint holds, copied to host memory (the only stall)
    writer.py         a snapshot written in the background or inline: files, manifest last, then retention
    manifest.py       the commit marker COMMITTED: every file with its size and checksum
    damage.py         a committed checkpoint whose files no longer match its manifest: found, named, never loaded
    listing.py        the checkpoints of an output_dir: committed, partial, damaged, best, newest
    retention.py      save_total_limit: the oldest committed checkpoints deleted, never the newest or the best
    lease.py          one run per output_dir; the run's canary on storage
    choice.py         the one choice of the checkpoint to resume from (driver, restart, hosted claim)
    resume.py         the driver's resume: choice.py's pick, or the error when none fits
    manager.py        the worker loop's view: save when due, resume, track the best
    model_io.py       model weights: save_pretrained or model.safetensors, read back verified
    peft_io.py        a PEFT model's adapters (adapter_model.safetensors) loaded back into it
    sharded.py        FSDP's shards through torch.distributed.checkpoint (DCP); async_shards.py: in the background
    consolidate.py    `raytrainer consolidate`: a sharded checkpoint's model as one model.safetensors

Storage itself (URLs, fsspec I/O, checksums, storage errors, retries, upload) is raytrainer/storage/, which
never imports this package.
"""
