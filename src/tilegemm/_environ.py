"""Environment variables read on every call, for the price of a dict look-up."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def environ_reader(name: str) -> tuple[Callable[[], Any], Callable[[str], Any]]:
    """(read, encode) for one environment variable read on every call: ``read()`` gives
    its value as stored, ``encode(text)`` a text as it would be stored, for comparisons.

    ``os.environ.get`` encodes the name and decodes the value each time: about 0.7 µs, a
    tenth of a remembered 8×8 product, and 10 µs right after a product that streamed more
    than the L2 cache, when the code it runs must come back from L3 (an Intel Xeon, family
    6 model 167). CPython's ``os.environ`` reads from a mapping of encoded names and values
    that every change made through ``os.environ`` updates at once, so reading it sees the
    same changes. Where that mapping is missing (another Python), ``os.environ.get`` and
    the plain text."""
    env = os.environ
    data = getattr(env, "_data", None)
    encode_key = getattr(env, "encodekey", None)
    encode_value = getattr(env, "encodevalue", None)
    if isinstance(data, dict) and callable(encode_key) and callable(encode_value):
        key = encode_key(name)
        return (lambda: data.get(key)), encode_value
    return (lambda: env.get(name)), (lambda text: text)
