"""Weir: an inference server as an asyncio microservice mesh over Redis Streams.

The shared core lives here: settings, the model repository and its config, the wire format,
stream names and the Redis connection. Services (``gateway``, ``batcher``, ``workers``)
depend on this package and never on each other; ``weir.cli`` composes them.
"""

__version__ = "0.1.0"
