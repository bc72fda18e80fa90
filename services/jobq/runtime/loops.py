"""The running event loop, asked for once per owner.

CPython 3.11's ``asyncio.get_running_loop()`` (and so ``create_task``,
``ensure_future``) makes a ``getpid()`` system call on every call, to notice
a fork. A consumer asked eight times a job: ~5 % of its CPU on a drain
(strace -c, py-spy --native; bench/README.md, #49). An object that lives in
one loop (the consumer's units, a coalescer) asks once, at its first use.
"""

from __future__ import annotations

import asyncio


class RunningLoop:
    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:  # the first use is in the loop the owner lives in
            loop = self._loop = asyncio.get_running_loop()
        return loop
