"""The broker with a deliberately broken shovel, for the shovel fault tests only.

`python -m interop_tests.broken_shovel_broker ARGS` runs the broker as `python -m amqp_server
ARGS` does, except that an on-confirm shovel acks its source as soon as it has published a
message (on-publish, while its status still says on-confirm): the source forgets messages the
destination may never have stored. interop_tests/test_shovel_faults.py runs against it to show
that it notices such a build: a kill -9 of the destination must then cost messages. The switch
lives here, in the test harness, never in the product.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from amqp_server.shovel import shovels
from amqp_server.shovel.definition import AckMode, ShovelDefinition

_parse = shovels.parse_shovel


def _acking_on_publish(*args: Any, **kwargs: Any) -> ShovelDefinition:
    definition = _parse(*args, **kwargs)
    if definition.ack_mode is AckMode.ON_CONFIRM:
        return dataclasses.replace(definition, ack_mode=AckMode.ON_PUBLISH)
    return definition


shovels.parse_shovel = _acking_on_publish  # type: ignore[assignment]

if __name__ == "__main__":
    from amqp_server.runtime.cli import main

    raise SystemExit(main())
