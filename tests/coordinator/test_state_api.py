"""A Ray this process starts points its own processes at its own state API: Ray Train's placement-group
cleaner otherwise asks whichever Ray `ray start` last recorded on this machine whether the run's controller
is alive, and tears down a live group when that other Ray answers "no such actor"."""

import socket

from raytrainer.coordinator.cluster import API_SERVER_ENV, own_state_api


def test_own_state_api_is_a_free_local_port_and_the_variable_naming_it():
    port, env = own_state_api()
    assert env == {API_SERVER_ENV: f"http://127.0.0.1:{port}"} and API_SERVER_ENV == "RAY_API_SERVER_ADDRESS"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free for the dashboard to bind
