"""Fault injection for storage tests: an S3 endpoint that goes down and comes back with its data, a full disk,
a read-only disk, and a bucket that vanishes."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import threading

import pytest


class OutageProxy:
    """A TCP proxy on loopback in front of the moto server. `cut()` drops every open connection and refuses
    new ones (as an endpoint that went away); `restore()` lets them through again. The data behind it stays,
    which restarting moto would lose."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.down = False
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint_url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.down:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket):
        try:
            while True:
                data = src.recv(65536)
                if not data or self.down:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self):
        self.down = True
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            _reset(s)

    def restore(self):
        self.down = False

    def close(self):
        self.cut()
        self._server.close()


def _reset(sock: socket.socket):
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()


@contextlib.contextmanager
def small_disk(size: str = "2m", read_only: bool = False):
    """A real filesystem that fills up (tmpfs of `size`) or refuses writes (read-only); skips the test where
    this process may not mount (not root, no CAP_SYS_ADMIN)."""
    path = tempfile.mkdtemp(prefix="raytrainer-disk-")
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True)
    if done.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)
        os.rmdir(path)


def delete_bucket(storage_options: dict, bucket_url: str):
    """Empty and delete a bucket, as an operator (or a lifecycle rule gone wrong) would."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options)
    bucket = bucket_url.partition("://")[2].split("/", 1)[0]
    for key in fs.find(bucket):
        fs.rm_file(key)
    fs.call_s3("delete_bucket", Bucket=bucket)


def empty_bucket(storage_options: dict, bucket_url: str):
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options)
    bucket = bucket_url.partition("://")[2].split("/", 1)[0]
    for key in fs.find(bucket):
        fs.rm_file(key)


def bucket_exists(storage_options: dict, bucket_url: str) -> bool:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options)
    bucket = bucket_url.partition("://")[2].split("/", 1)[0]
    names = [b["Name"] for b in fs.call_s3("list_buckets")["Buckets"]]
    return bucket in names
