"""Shared pieces of the Python tests: the backends of this build, a
bootstrap server per test, and the wait for rooms to end (on the engine's
change notifications, never on a sleep)."""

import pytest

import pdkv

BACKENDS = [b for b in ("nixl", "mooncake", "mori") if b in pdkv.transport_names()]


@pytest.fixture
def bootstrap():
    server = pdkv.BootstrapServer("127.0.0.1", 0)
    yield f"127.0.0.1:{server.port}"
    server.close()


def wait_until(engines, done, timeout_s=20.0):
    """Waits on the engines' change notifications until done() holds."""
    import time
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done within {timeout_s} s")
        for engine in engines:
            if engine.wait_for_changes(0.05):
                engine.take_changed_rooms()


def ended(*rooms):
    return all(r.poll() in (pdkv.PollState.Success, pdkv.PollState.Failed) for r in rooms)
