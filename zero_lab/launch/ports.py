"""A free TCP port on 127.0.0.1: the only port probe in zero-lab (the launcher, the harness's
single-process default and the tests' spawned ranks all ask here)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS says is free now; each launch asks again, so two launches never share one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
