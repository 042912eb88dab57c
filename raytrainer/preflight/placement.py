"""With Ray connected, before any actor starts: the cluster can hold the run, and its output_dir is storage every
worker reaches and may write."""

from __future__ import annotations

from typing import Sequence

from .. import storage
from ..coordinator import cluster, holders
from ..errors import StorageError


def check_placement(args, use_gpu: bool, ray_datasets: Sequence = ()):
    """The workers can be placed (an elastic run: its minimum), the steps of the Ray Datasets the run reads
    (`ray_datasets`) keep the CPUs they ask besides the workers (on a Ray this process started, the workers' CPU
    share is lowered for them first), and a local output_dir is not written from several nodes. num_workers=0
    runs here: nothing to place."""
    if args.max_workers == 0:
        return
    data_cpus, asks = cluster.data_cpu_asks(ray_datasets)
    if ray_datasets:
        cluster.leave_cpus_for_data(args, use_gpu, data_cpus)  # may set args.resources_per_worker: read it after
    cluster.check_placeable(args.num_workers, cluster.worker_resources(args, use_gpu))
    if ray_datasets:
        cluster.check_cpus_left_for_data(args.max_workers, cluster.worker_resources(args, use_gpu), data_cpus, asks)
    check_shared_output_dir(args)


def make_room_for_data(ray_datasets: Sequence):
    """The loss check reads a Ray Dataset's first rows on the driver, through its pipeline's tasks: an idle worker
    group of this process that holds the CPUs they ask (a map-style run's group holds every CPU of a laptop) would
    make that read wait until its idle timeout. Release such groups first, as a new group's start would."""
    if ray_datasets:
        data_cpus, asks = cluster.data_cpu_asks(ray_datasets)
        holders.check_room({"CPU": data_cpus}, f"reading the first rows of a ray.data.Dataset ({asks})")


def check_shared_output_dir(args):
    """Workers on other nodes would write checkpoints nobody else can read into a local path."""
    if (storage.is_local(args.output_dir) and cluster.alive_node_count() > 1
            and not args.allow_local_output_dir_on_multinode):
        raise StorageError(
            f"output_dir={args.output_dir!r} is a local path, but the cluster has "
            f"{cluster.alive_node_count()} nodes: workers on other nodes would write checkpoints "
            "nobody else can read. Use shared storage (s3://..., or an NFS mount) or, if this path "
            "is shared, set allow_local_output_dir_on_multinode=True.")


def check_output_dir(args):
    """output_dir can be written, read back and deleted (storage's probe): a missing bucket, bad credentials or a
    read-only path fail here."""
    storage.check_writable(args.output_dir, args.storage_options)
