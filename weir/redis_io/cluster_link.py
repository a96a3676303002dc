"""The hot-path link to a Redis Cluster: :class:`~weir.redis_io.link.Link`'s interface.

A call's commands are cut into *runs*: consecutive commands whose slots one primary serves
(:mod:`weir.redis_io.cluster_slots` finds the slots; a keyless command goes with its
neighbours, a ``MULTI`` ... ``EXEC`` block is one unit whose keys must share a slot). The
runs are sent in order, each awaited before the next, so every command runs after all those
before it in the call, whatever node they went to (a reply is written before the ack that
settles it). A command whose keys lie on several slots raises ValueError before anything is
sent.

Redirections. ``MOVED`` (the slot lives elsewhere now) fetches the map again, once per
call and one fetch for concurrent callers; ``ASK`` (the key is on the importing node of a
migration) resends there after ``ASKING``, the map unchanged; ``TRYAGAIN`` and
``CLUSTERDOWN`` resend after a pause (at most ``MAX_REDIRECTS`` / ``MAX_RETRIES`` times,
then the error replies are returned). Redis refuses per command, before running any of it,
so exactly the refused commands are resent, in their order: in a run ``[a, b, c]`` where only
``b`` was refused, ``a`` and ``c`` ran, and resending "from ``b`` on" would run ``c`` twice.
The price, only while the map is stale and only between slots of one node: ``b`` runs after
``c``. A ``MULTI`` block with a refused command is aborted by Redis (``EXECABORT``) and
resent whole.

A lost or failed connection is raised to the caller as :class:`ConnectionError`, as with
:class:`~weir.redis_io.link.Link`: the commands may or may not have run, and retrying writes
is the caller's decision. The map is fetched again first (the node may have failed over),
and the next call that would go to that node fetches it again before sending, so once a
replica is promoted the next call reaches it.

A blocking command (``XREAD BLOCK``) holds its connection until it returns: calls with
``block_s`` use a connection per slot (a Link for each slot read, made on first use), never
one that non-blocking calls share (those share one Link per node). Reads of several slots
(:mod:`weir.redis_io.fanin`) then block side by side.

``identify`` is ignored (a cluster has no one ``run_id``: :attr:`ClusterLink.server_id` stays
None); :attr:`ClusterLink.epoch` counts the slots it saw move to another primary (a failover
or a resharding), which may lack what the old one acknowledged (gateway.resubmission).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from weir.redis_io import cluster_slots
from weir.redis_io.cluster_slots import Address, SlotRange, Unit
from weir.redis_io.link import CONNECT_TIMEOUT_S, REPLY_TIMEOUT_S, Command, Link, raise_errors
from weir.redis_io.redis_target import parse_cluster_url
from weir.redis_io.retry import backoff

__all__ = ["MAX_REDIRECTS", "MAX_RETRIES", "ClusterLink", "parse_cluster_url"]

logger = logging.getLogger(__name__)

MAX_REDIRECTS = 5
# TRYAGAIN and CLUSTERDOWN are resent fewer times: each waits, and the caller retries too.
MAX_RETRIES = 3
_REDIRECTS = ("MOVED ", "ASK ")
_REFUSALS = (*_REDIRECTS, "TRYAGAIN", "CLUSTERDOWN")
_KEYLESS = -1  # the blocking connections' key for a run without keys


@dataclass(slots=True)
class _Run:
    """Units sent to one node as one pipeline (each after ``ASKING`` when ``asking``)."""

    address: Address
    units: list[Unit]
    asking: bool = False

    @property
    def slot(self) -> int:
        return next((u.slot for u in self.units if u.slot is not None), _KEYLESS)

    def commands(self) -> list[Command]:
        prefix: list[Command] = [("ASKING",)] if self.asking else []
        return [command for unit in self.units for command in (*prefix, *unit.commands)]

    def split(self, replies: list[Any]) -> list[list[Any]]:
        """``replies`` per unit, without the ``ASKING`` ones."""
        out: list[list[Any]] = []
        at = 0
        for unit in self.units:
            at += self.asking
            out.append(replies[at : at + len(unit.commands)])
            at += len(unit.commands)
        return out


@dataclass(slots=True)
class _Call:
    block_s: float
    map_version: int  # of the map the last run was sent by
    refreshed: bool = False  # the map was fetched again during this call


class ClusterLink:
    """A Redis Cluster for pipelines of raw commands; fetches the slot map on first use."""

    def __init__(
        self,
        url: str,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        identify: bool = False,
    ) -> None:
        self.startup_nodes, self.template = parse_cluster_url(url)
        self.reply_timeout_s = reply_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.identify = identify
        self.server_id: bytes | None = None  # always: see the module's docstring
        self._tls = self.template.startswith("rediss:")
        self._owners: list[Address | None] = []  # slot -> primary; empty until fetched
        self._primaries: list[Address] = []
        self._links: dict[Address, Link] = {}
        self._blocking: dict[int, tuple[Address, Link]] = {}  # slot -> its blocking link
        self._unreachable: set[Address] = set()  # nodes whose connection failed last
        self._refreshing: asyncio.Task[None] | None = None
        self._map_version = 0  # counts the maps fetched
        self.epoch = 0  # slot moves seen (failover, resharding): see gateway.resubmission
        self._backoff = backoff()

    async def connect(self) -> None:
        """Fetch the slot map now (connecting to the node that gives it), unless done.

        ConnectionError (a RedisError) when no node gave one; the other primaries are
        connected to on first use.
        """
        if not self._owners:
            await self._fetch_map()

    async def refresh(self) -> None:
        """Fetch the slot map again now (a change moves :attr:`epoch`)."""
        await self._fetch_map()

    def slot_of(self, key: str) -> int:
        """The Redis Cluster slot of ``key``."""
        return cluster_slots.slot_of(key)

    def node_of(self, slot: int) -> Hashable:
        """The primary that serves ``slot`` by the map as last fetched (None before one)."""
        return self._owners[slot] if self._owners else None

    async def call(self, *commands: Command, block_s: float = 0.0) -> list[Any]:
        """Send ``commands`` as a pipeline per node, in order; their replies, in order.

        As :meth:`weir.redis_io.link.Link.call`: an error reply is a ResponseError in the list;
        ConnectionError when a connection fails (what was sent may or may not have run).
        ValueError, before anything is sent, for keys on several slots in one command or
        one MULTI block.
        """
        units = cluster_slots.split_units(commands)
        if not units:
            return []
        await self.connect()
        call = _Call(block_s, self._map_version)
        runs = self._plan(units)
        if any(run.address in self._unreachable for run in runs):
            await self._refresh(call)  # it may have failed over since
            runs = self._plan(units)
        replies: list[Any] = []
        for run in runs:
            for unit_replies in await self._send(run, call, 0):
                replies.extend(unit_replies)
        return replies

    async def transaction(self, *commands: Command) -> list[Any]:
        """Run ``commands`` (keys on one slot) in MULTI/EXEC; as :meth:`Link.transaction`.

        Their results, or the first error raised; ValueError, before anything is sent, when
        their keys lie on several slots.
        """
        replies = await self.call(("MULTI",), *commands, ("EXEC",))
        raise_errors(replies[:-1])
        results = replies[-1]
        if not isinstance(results, list):
            raise ResponseError(f"transaction did not run: {results!r}")
        return raise_errors(results)

    async def close(self) -> None:
        task, self._refreshing = self._refreshing, None
        if task is not None:
            task.cancel()
        links = [*self._links.values(), *(link for _, link in self._blocking.values())]
        self._links.clear()
        self._blocking.clear()
        for link in links:
            await link.close()

    def _plan(self, units: list[Unit]) -> list[_Run]:
        """``units`` as runs: consecutive units for one primary; keyless ones with the run."""
        owners = [None if unit.slot is None else self._owner(unit.slot) for unit in units]
        current = next((owner for owner in owners if owner), None) or self._any_primary()
        runs: list[_Run] = []
        for unit, owner in zip(units, owners, strict=True):
            current = owner or current
            if runs and runs[-1].address == current:
                runs[-1].units.append(unit)
            else:
                runs.append(_Run(current, [unit]))
        return runs

    def _owner(self, slot: int) -> Address:
        # A slot no primary serves: any primary answers MOVED or CLUSTERDOWN, both followed.
        return self._owners[slot] or self._any_primary()

    def _any_primary(self) -> Address:
        return self._primaries[0] if self._primaries else self.startup_nodes[0]

    async def _send(self, run: _Run, call: _Call, redirects: int) -> list[list[Any]]:
        """The replies of ``run``'s units, refused ones resent (``redirects`` so far)."""
        link = await self._link_for(run, call)
        call.map_version = self._map_version
        try:
            replies = await link.call(*run.commands(), block_s=call.block_s)
        except RedisConnectionError:
            if self._holds(link):  # not one that close() dropped
                self._unreachable.add(run.address)
                await self._refresh(call)
            raise
        self._unreachable.discard(run.address)
        per_unit = run.split(replies)
        refused = _to_resend(run, per_unit, redirects)
        if refused:
            await self._resend(run, per_unit, refused, call, redirects + 1)
        return per_unit

    async def _resend(
        self,
        run: _Run,
        per_unit: list[list[Any]],
        refused: list[tuple[int, ResponseError]],
        call: _Call,
        redirects: int,
    ) -> None:
        """Send the refused units again where their refusals say; their replies replaced."""
        if any(not str(error).startswith(_REDIRECTS) for _, error in refused):
            await asyncio.sleep(self._backoff.compute(redirects))  # TRYAGAIN, CLUSTERDOWN
        targets = [
            (at, *await self._reroute(run, run.units[at], error, call)) for at, error in refused
        ]
        for places, retry in _regroup(run, targets):
            replies = await self._send(retry, call, redirects)
            for at, unit_replies in zip(places, replies, strict=True):
                per_unit[at] = unit_replies

    async def _reroute(
        self, run: _Run, unit: Unit, error: ResponseError, call: _Call
    ) -> tuple[Address, bool]:
        """Where a refused unit goes now, and whether after ``ASKING``."""
        kind, _, rest = str(error).partition(" ")
        if kind not in ("MOVED", "ASK"):  # TRYAGAIN, CLUSTERDOWN: the owner, again
            return (run.address if unit.slot is None else self._owner(unit.slot)), False
        slot, _, where = rest.partition(" ")
        address = cluster_slots.redirect_address(where, run.address)
        if kind == "ASK":
            return address, True
        if self._owners and self._owners[int(slot)] != address:
            self._owners[int(slot)] = address  # until the fetched map says better
            self.epoch += 1
        await self._refresh(call)
        return address, False

    async def _link_for(self, run: _Run, call: _Call) -> Link:
        if call.block_s <= 0:
            return self._node_link(run.address)
        held = self._blocking.get(run.slot)
        if held is not None and held[0] == run.address:
            return held[1]
        if held is not None:  # the slot moved: its old node's connection is no use
            await held[1].close()
        link = self._new_link(run.address)
        self._blocking[run.slot] = (run.address, link)
        return link

    def _holds(self, link: Link) -> bool:
        return link in self._links.values() or any(link is b for _, b in self._blocking.values())

    def _node_link(self, address: Address) -> Link:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = self._new_link(address)
        return link

    def _new_link(self, address: Address) -> Link:
        url = cluster_slots.node_url(self.template, address)
        return Link(url, self.reply_timeout_s, self.connect_timeout_s)

    async def _refresh(self, call: _Call) -> None:
        """Fetch the map again, once per call; a failure is logged (the call goes on).

        Not when a map came since the call's last run was sent: it knows better already.
        """
        if call.refreshed or self._map_version != call.map_version:
            return
        call.refreshed = True
        try:
            await self._fetch_map()
        except RedisError as exc:
            logger.warning("could not fetch the Redis Cluster slot map again: %s", exc)

    async def _fetch_map(self) -> None:
        """Fetch the slot map, sharing a fetch already under way."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.ensure_future(self._load_map())
            task.add_done_callback(_retrieve)
        # Shielded: a caller cancelled while waiting leaves the others' fetch running.
        await asyncio.shield(task)

    async def _load_map(self) -> None:
        problems: list[str] = []
        for address in self._candidates():
            try:
                ranges = await self._ask_map(address)
            except RedisError as exc:
                problems.append(f"{address[0]}:{address[1]}: {exc}")
                continue
            owners = cluster_slots.owners(ranges)
            if self._owners and owners != self._owners:
                self.epoch += 1
            self._owners = owners
            self._primaries = list(dict.fromkeys(address for _, _, address in ranges))
            self._map_version += 1
            return
        raise RedisConnectionError("no Redis Cluster node gave its slots: " + "; ".join(problems))

    def _candidates(self) -> list[Address]:
        """The nodes to ask for the map: known primaries, the URL's, failed ones last."""
        known = [*self._primaries, *self.startup_nodes]
        answering = [a for a in known if a not in self._unreachable]
        return list(dict.fromkeys([*answering, *known]))

    async def _ask_map(self, address: Address) -> list[SlotRange]:
        link = self._node_link(address)
        (reply,) = await link.call(("CLUSTER", "SHARDS"))
        if isinstance(reply, ResponseError):  # before Redis 7
            (reply,) = await link.call(("CLUSTER", "SLOTS"))
            if isinstance(reply, ResponseError):
                raise reply
            ranges = cluster_slots.slots_ranges(reply, address)
        else:
            ranges = cluster_slots.shards_ranges(reply, address, self._tls)
        if not ranges:
            raise ResponseError("it serves no slots: not part of a cluster yet")
        return ranges


def _to_resend(
    run: _Run, per_unit: list[list[Any]], redirects: int
) -> list[tuple[int, ResponseError]]:
    """The units of ``run`` refused whole, with their refusals, that may be sent again."""
    refused: list[tuple[int, ResponseError]] = []
    for at, (unit, replies) in enumerate(zip(run.units, per_unit, strict=True)):
        error = _refusal(unit, replies)
        limit = MAX_REDIRECTS if str(error).startswith(_REDIRECTS) else MAX_RETRIES
        if error is not None and redirects < limit:
            refused.append((at, error))
    return refused


def _regroup(run: _Run, targets: list[tuple[int, Address, bool]]) -> list[tuple[list[int], _Run]]:
    """Runs of the refused units (``(index, address, asking)``) in order, with their indexes."""
    retries: list[tuple[list[int], _Run]] = []
    for at, address, asking in targets:
        last = retries[-1][1] if retries else None
        if last is not None and (last.address, last.asking) == (address, asking):
            retries[-1][0].append(at)
            last.units.append(run.units[at])
        else:
            retries.append(([at], _Run(address, [run.units[at]], asking)))
    return retries


def _refusal(unit: Unit, replies: list[Any]) -> ResponseError | None:
    """The reply that refused ``unit`` whole (nothing of it ran), if one did."""
    last = replies[-1]
    if not isinstance(last, ResponseError):
        return None
    if _refused(last):
        return last
    if len(unit.commands) > 1 and str(last).startswith("EXECABORT"):
        for reply in replies[1:-1]:  # the block's queueing replies
            if isinstance(reply, ResponseError) and _refused(reply):
                return reply
    return None


def _refused(reply: ResponseError) -> bool:
    return str(reply).startswith(_REFUSALS)


def _retrieve(task: asyncio.Task[None]) -> None:
    # A fetch whose callers were all cancelled: its failure is not worth a warning.
    if not task.cancelled():
        task.exception()
