"""JOBQ_AMQP_URL with several URLs (issue #15): a service connects to any
live node, whichever place in the list it starts from; none live is one
clear error naming them all (no password); refused credentials on one node
are reported as such, not as an outage."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import pytest

from harness.helpers import free_port
from jobq.amqp.broker import Broker
from jobq.client.producer import Client
from jobq.errors import BrokerUnavailable, ConfigError
from jobq.settings import Settings


def dead_url(url: str) -> str:
    """The same URL on a port nothing listens on."""
    u = urlsplit(url)
    auth = u.netloc.rpartition("@")[0]
    return urlunsplit(u._replace(netloc=f"{auth}@127.0.0.1:{free_port()}"))


def test_a_dead_node_in_the_list_is_skipped_wherever_it_is(settings: Settings) -> None:
    for urls in ([dead_url(settings.amqp_url), settings.amqp_url],
                 [settings.amqp_url, dead_url(settings.amqp_url)]):
        s = settings.model_copy(update={"amqp_url": ",".join(urls)})

        async def go(s: Settings = s) -> None:
            for _ in range(4):  # each connect starts at a random place in the list
                async with Client(s) as c:
                    await c.publish("work", {})

        asyncio.run(go())


def test_no_live_node_is_one_error_naming_them_all(settings: Settings) -> None:
    urls = [dead_url(settings.amqp_url), dead_url(settings.amqp_url)]

    async def go() -> None:
        await Broker(",".join(urls), settings.namespace).connect(wait=False)

    with pytest.raises(BrokerUnavailable) as err:
        asyncio.run(go())
    text = str(err.value)
    for u in urls:
        assert f"127.0.0.1:{urlsplit(u).port}" in text
    assert "guest:" not in text


def test_refused_credentials_on_one_node_say_so(settings: Settings) -> None:
    u = urlsplit(settings.amqp_url)
    wrong = urlunsplit(u._replace(netloc=f"nobody:wrong@{u.netloc.rpartition('@')[2]}"))

    async def go() -> None:
        await Broker(f"{dead_url(settings.amqp_url)},{wrong}", settings.namespace).connect(
            wait=False)

    with pytest.raises(ConfigError, match="refused the credentials"):
        asyncio.run(go())
