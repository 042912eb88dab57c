"""worker/entry.py's answer to a RayActorError out of a job: the worker ends quietly when the job board's sink is
gone (its driver died: Tune ended a trial's actor at a sweep's end), and raises when the sink still answers (the
error was the user's own actor's). `sink_alive` decides which, on a real actor whose process exits here."""

import pytest

from raytrainer.worker.entry import sink_alive


class Board:
    """The one sink method `sink_alive` asks: any answer means alive."""

    def controller(self):
        return None

    def exit(self):
        import os

        os._exit(0)  # as the process of a driver's sink ends with its owner


def test_a_killed_sink_is_gone_and_a_live_one_answers(ray_session):
    import ray

    sink = ray.remote(num_cpus=0)(Board).remote()
    assert sink_alive(sink) is True
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(sink.exit.remote())  # returns once the process is gone
    assert sink_alive(sink) is False
