"""Where things are in a Redis Cluster: the URL's nodes, each command's slot, the slot map.

Nothing here does I/O; :mod:`weir.redis_io.cluster_link` sends. A key's slot is CRC16 of the key
(or of its hash tag: what lies between the first ``{`` and the first ``}`` after it, when
not empty) mod 16384. A command's keys come from a table by command name: the ones the mesh
sends and the common ones around them. A command missing from the table counts as keyless;
sent anywhere, it is answered ``MOVED`` and followed there, but it is not checked for
keys on several slots.
"""

from __future__ import annotations

from binascii import crc_hqx
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

# Types only: weir.redis_io.redis_target imports this module, and weir.redis_io.link that.
if TYPE_CHECKING:
    from weir.redis_io.link import Arg, Command

# The template URL's host: never dialled, each node's address replaces it.
PLACEHOLDER_HOST = "cluster-node"
SLOTS = 16384  # Redis Cluster's hash slots

Address = tuple[str, int]
# A slot range and its primary: (first slot, last slot, address).
SlotRange = tuple[int, int, Address]

# (first key, last key, step) as COMMAND INFO writes them: a negative last counts from the
# end (-1: the last argument).
# fmt: off
_KEY_SPECS: dict[str, tuple[int, int, int]] = {
    **dict.fromkeys((
        "XADD", "XACK", "XTRIM", "XDEL", "XRANGE", "XREVRANGE", "XLEN", "XPENDING", "XCLAIM",
        "XAUTOCLAIM", "XSETID", "GET", "SET", "SETNX", "SETEX", "PSETEX", "GETSET", "GETDEL",
        "GETEX", "APPEND", "STRLEN", "INCR", "INCRBY", "INCRBYFLOAT", "DECR", "DECRBY", "HSET",
        "HSETNX", "HGET", "HGETALL", "HMGET", "HMSET", "HINCRBY", "HINCRBYFLOAT", "HDEL", "HLEN",
        "HEXISTS", "HKEYS", "HVALS", "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "TTL", "PTTL",
        "PERSIST", "TYPE", "SADD", "SREM", "SISMEMBER", "SMISMEMBER", "SMEMBERS", "SCARD", "SPOP",
        "SRANDMEMBER", "ZADD", "ZREM", "ZSCORE", "ZINCRBY", "ZCARD", "ZCOUNT", "ZRANGE",
        "ZRANGEBYSCORE", "ZREVRANGE", "ZREVRANGEBYSCORE", "ZRANK", "ZREMRANGEBYSCORE",
        "ZREMRANGEBYRANK", "ZPOPMIN", "ZPOPMAX", "ZMSCORE", "LPUSH", "RPUSH", "LPOP", "RPOP",
        "LRANGE", "LLEN", "LTRIM", "LREM", "LINDEX", "LSET", "DUMP", "RESTORE", "GETRANGE",
        "SETRANGE", "GETBIT", "SETBIT", "BITCOUNT", "PFADD",
    ), (1, 1, 1)),
    **dict.fromkeys(("DEL", "UNLINK", "EXISTS", "MGET", "TOUCH", "WATCH", "PFCOUNT"), (1, -1, 1)),
    **dict.fromkeys(("MSET", "MSETNX"), (1, -1, 2)),
    **dict.fromkeys(
        ("RENAME", "RENAMENX", "RPOPLPUSH", "LMOVE", "BLMOVE", "SMOVE", "COPY"), (1, 2, 1)
    ),
    **dict.fromkeys(("BLPOP", "BRPOP"), (1, -2, 1)),
    **dict.fromkeys(("XGROUP", "XINFO", "OBJECT", "MEMORY"), (2, 2, 1)),
}
# fmt: on
_SCRIPTS = frozenset(("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"))
_STREAM_READS = frozenset(("XREAD", "XREADGROUP"))
_BLOCK_ENDS = frozenset(("EXEC", "DISCARD"))


@dataclass(slots=True)
class Unit:
    """What goes to one node whole: one command, or a ``MULTI`` ... ``EXEC`` block.

    ``slot`` is that of its keys; None when it has none.
    """

    commands: list[Command]
    slot: int | None


def node_url(template: str, address: Address) -> str:
    """The URL of the node at ``address``: the template's credentials and options."""
    parts = urlsplit(template)
    userinfo, at, _ = parts.netloc.rpartition("@")
    host, port = address
    if ":" in host:
        host = f"[{host}]"
    return parts._replace(netloc=f"{userinfo}{at}{host}:{port}").geturl()


def slot_of(key: Arg) -> int:
    """The slot of ``key``: CRC16 (XMODEM) of its hash tag when it has one, else of it all.

    The cluster specification's rule: the tag is what lies between the first ``{`` and the
    first ``}`` after it, when that is not empty. Computed here rather than by redis-py, so
    that reading a Redis URL (``weir up``'s settings) does not load all of redis-py.
    """
    raw = _bytes(key)
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return crc_hqx(raw, 0) % SLOTS


def split_units(commands: Sequence[Command]) -> list[Unit]:
    """``commands`` as units with their slots; ValueError for keys on several slots.

    Raised before anything is sent: Redis Cluster would refuse the command (CROSSSLOT),
    and a MULTI block's keys must all be on one slot for it to run on one node.
    """
    units: list[Unit] = []
    block: list[Command] | None = None
    for command in commands:
        name = command_name(command)
        if block is None and name != "MULTI":
            units.append(Unit([command], _one_slot(command_keys(command), name)))
        elif block is None:
            block = [command]
        else:
            block.append(command)
            if name in _BLOCK_ENDS:
                units.append(_block_unit(block))
                block = None
    if block is not None:
        raise ValueError("a MULTI must end (EXEC or DISCARD) in the same call on a cluster")
    return units


def _block_unit(block: list[Command]) -> Unit:
    keys = [key for command in block for key in command_keys(command)]
    return Unit(block, _one_slot(keys, "a MULTI block"))


def _one_slot(keys: list[Arg], what: str) -> int | None:
    slots = {slot_of(key) for key in keys}
    if len(slots) > 1:
        raise ValueError(
            f"the keys of {what} lie on different Redis Cluster slots ({sorted(slots)}): "
            f"{[_bytes(key) for key in keys]}; give them one hash tag, as {{tag}}name"
        )
    return slots.pop() if slots else None


def command_name(command: Command) -> str:
    if not command:
        return ""
    name = command[0]
    return (name.decode("latin-1") if isinstance(name, bytes) else str(name)).upper()


def command_keys(command: Command) -> list[Arg]:
    """The keys ``command`` names (none for a command missing from the table)."""
    name = command_name(command)
    if name in _SCRIPTS:
        count = int(_bytes(command[2])) if len(command) > 2 else 0
        return list(command[3 : 3 + count])
    if name in _STREAM_READS:
        return _stream_keys(command, 4 if name == "XREADGROUP" else 1)
    first, last, step = _KEY_SPECS.get(name, (0, 0, 1))
    if first == 0 or len(command) <= first:
        return []
    end = last + 1 if last > 0 else len(command) + last + 1
    return list(command[first:end:step])


def _stream_keys(command: Command, options_at: int) -> list[Arg]:
    """The streams an XREAD names: the first half of what follows ``STREAMS``."""
    for at in range(options_at, len(command)):
        arg = command[at]
        if isinstance(arg, bytes | str) and _bytes(arg).upper() == b"STREAMS":
            rest = command[at + 1 :]
            return list(rest[: len(rest) // 2])
    return []


def _bytes(arg: Arg) -> bytes:
    """``arg`` as sent (:func:`weir.redis_io.link.pack`'s encoding)."""
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, float):
        return repr(arg).encode()
    return b"%d" % arg


def shards_ranges(reply: Any, asked: Address, tls: bool) -> list[SlotRange]:
    """The primaries' slot ranges in a ``CLUSTER SHARDS`` reply (Redis 7)."""
    ranges: list[SlotRange] = []
    for shard in reply:
        fields = _pairs(shard)
        nodes = [_pairs(node) for node in fields.get(b"nodes", [])]
        primaries = [node for node in nodes if node.get(b"role") == b"master"]
        # A failed primary still listed beside its promoted replica: the online one serves.
        primaries.sort(key=lambda node: node.get(b"health") != b"online")
        if not primaries:
            continue
        address = _shard_address(primaries[0], asked, tls)
        bounds = fields.get(b"slots", [])
        ranges.extend((bounds[i], bounds[i + 1], address) for i in range(0, len(bounds), 2))
    return ranges


def _shard_address(node: dict[bytes, Any], asked: Address, tls: bool) -> Address:
    host = node.get(b"endpoint") or b""
    if host in (b"", b"?"):  # no preferred endpoint announced: its IP
        host = node.get(b"ip") or b""
    port = (node.get(b"tls-port") if tls else None) or node.get(b"port") or node.get(b"tls-port")
    return _host(host, asked), int(port or 0)


def slots_ranges(reply: Any, asked: Address) -> list[SlotRange]:
    """The primaries' slot ranges in a ``CLUSTER SLOTS`` reply (before Redis 7)."""
    return [(start, end, (_host(node[0], asked), int(node[1]))) for start, end, node, *_ in reply]


def _host(host: bytes | None, asked: Address) -> str:
    # Empty (or unknown): the node is reached at the host of the node that answered.
    return host.decode() if host and host != b"?" else asked[0]


def _pairs(flat: list[Any]) -> dict[bytes, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def redirect_address(where: str, asked: Address) -> Address:
    """The ``host:port`` of a MOVED or ASK reply (an empty host: the node that answered)."""
    host, _, port = where.rpartition(":")
    return _host(host.encode(), asked), int(port)


def owners(ranges: list[SlotRange]) -> list[Address | None]:
    """Each slot's primary (None for a slot no primary serves)."""
    table: list[Address | None] = [None] * SLOTS
    for start, end, address in ranges:
        table[start : end + 1] = [address] * (end - start + 1)
    return table
