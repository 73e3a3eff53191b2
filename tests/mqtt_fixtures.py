"""pytest fixtures: a real mosquitto per test and a factory of recording subscribers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mosquitto import Mosquitto, Subscriber

SubscriberFactory = Callable[..., Subscriber]


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A started broker on 127.0.0.1:<free port>, stopped after the test."""
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def mqtt_subscriber_factory() -> Iterator[SubscriberFactory]:
    """`factory(broker, topic_filter, **kwargs)` -> a connected, subscribed `Subscriber`; closed after."""
    made: list[Subscriber] = []

    def factory(broker: Mosquitto, topic_filter: str, **kwargs: Any) -> Subscriber:
        sub = Subscriber(broker.host, broker.port, topic_filter, **kwargs)
        made.append(sub)
        return sub

    yield factory
    for sub in made:
        sub.close()
