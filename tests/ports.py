"""A port the OS says is free now, for a test's single process that binds it at once (MASTER_PORT of an
in-process rank 0). A launch of several processes binds port 0 instead (`tests/spawn.py`, torchrun's
`--rdzv-endpoint 127.0.0.1:0`): a port probed free and bound later can be taken in between."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
