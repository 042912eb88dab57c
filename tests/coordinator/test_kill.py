"""kill_and_wait: a group's controller and event sink are killed, never left to exit when their last handle
goes (Ray 2.60's graceful actor exit can hang in its core worker's teardown, a process left behind). The kill
is only a request: had the handle gone at once, the report that no reference is left could reach Ray first.
Measured before this change: 4 graceful exits in 60 kills whose handle went at once; the test below, with the
handle dropped right after `ray.kill`, failed 2 of 3 tries (several graceful exits each)."""

from tests.coordinator.test_cleaner import Idle
from tests.support import wait_for

ACTORS = 20  # about 1 in 15 went out of scope first: 20 kills catch it most times


def death(actor_id: str):
    """The actor's death cause in Ray's actor table, None while it lives."""
    import ray._private.state

    row = ray._private.state.actors(actor_id)
    return row["DeathCause"].actor_died_error_context.error_message if row["State"] == "DEAD" else None


def test_every_actor_dies_by_the_kill_though_its_handle_goes_right_after(ray_session):
    from raytrainer.coordinator.group import kill_and_wait

    actors = [ray_session.remote(num_cpus=0)(Idle).remote() for _ in range(ACTORS)]
    ray_session.get([actor.ready.remote() for actor in actors], timeout=120)
    ids = [actor._actor_id.hex() for actor in actors]
    while actors:
        kill_and_wait(actors.pop())  # the last handle goes as the call returns
    wait_for(lambda: all(death(actor_id) for actor_id in ids), 30, every_s=0.2)
    causes = [death(actor_id) for actor_id in ids]
    assert [cause for cause in causes if "killed by `ray.kill`" not in cause] == []
