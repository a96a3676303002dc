"""The batcher service: request streams in, batch streams out.

One reader task reads every request stream and every credit stream of the models served
through the ``batcher`` consumer group (many entries per ``XREADGROUP``) and hands each entry
to its model's :class:`~batcher.lane.BatcherLane`; one dispatcher task per lane sends the
batches. Entries left pending by a batcher that died are claimed by a live one. On SIGTERM
the batcher stops reading and flushes what its lanes hold.

In a model control mode the lanes follow the desired state (:mod:`weir.control`): a new
(model, version) gets a lane at once, a new config replaces the lane (the old one sends what
it holds, the new one takes its credits), and a lane no longer desired keeps batching until
its version admits nothing and every request it accepted is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from redis.exceptions import RedisError

from batcher.lane import BatcherLane
from batcher.sequences import SequenceLease
from weir import names
from weir.cancels import CancelWatch
from weir.control.desired import DesiredState, DesiredStore
from weir.control.follower import Follower, Retirement
from weir.control.mode import ControlMode
from weir.errors import ConfigError
from weir.liveness import Heartbeat, live_consumers
from weir.log_settings import LogControl
from weir.reclaim import Reclaimer
from weir.redis_io.connection import connect
from weir.redis_io.links import open_link
from weir.redis_io.retry import RetryWait
from weir.repository import ModelEntry, Repository
from weir.service import Service, TaskSet
from weir.settings import BatcherSettings
from weir.streams import Entry, StreamGroup, group_info
from weir.trim import Trimmer
from weir.workload import served_instances

logger = logging.getLogger(__name__)


class Batcher(Service):
    """Reads every request stream, forms batches, writes them to the batch streams."""

    name = "batcher"

    def __init__(self, settings: BatcherSettings) -> None:
        super().__init__(settings.shutdown_grace_s)
        self.settings = settings
        self.consumer = f"batcher-{uuid.uuid4().hex[:12]}"
        self.redis = connect(settings.redis_url, retries=settings.redis_retries)
        self.group = StreamGroup(self.redis, names.BATCHER_GROUP, self.consumer)
        # The hot path's connections: one for the blocking reads, one for the lanes' sends.
        self.read_link = open_link(settings.redis_url, settings.redis_timeout_s)
        self.send_link = open_link(settings.redis_url, settings.redis_timeout_s)
        self.reclaimer = Reclaimer(self.group, settings.reclaim_idle_ms)
        self.heartbeat = Heartbeat(
            self.redis, names.BATCHER_GROUP, self.consumer, settings.heartbeat_ttl_s, bytes
        )
        self.lease = SequenceLease(self.redis, self.consumer, settings.heartbeat_ttl_s)
        self.lanes: dict[str, BatcherLane] = {}
        self.routes: dict[str, tuple[BatcherLane, bool]] = {}
        self.dispatchers: dict[BatcherLane, asyncio.Task[None]] = {}
        self.retiring: set[str] = set()  # request streams of lanes no longer desired
        self.retirement = Retirement(self.redis, settings.retire_timeout_s)
        self.trimmer = Trimmer(self.redis, names.BATCHER_GROUP, [])
        self.follower = Follower(DesiredStore(self.redis), settings.control_refresh_s, self._follow)
        self.tasks = TaskSet()
        self.siblings = False  # other live batchers: credits are shared with them
        self.lanes_added = asyncio.Event()  # wakes a reader that had no stream to read
        self.cancels = CancelWatch(
            settings.redis_url, settings.redis_timeout_s, settings.block_ms, self._noticed
        )

    async def startup(self) -> None:
        if self.settings.model_control_mode is ControlMode.NONE:
            repository = Repository.load(self.settings.repository, self.settings.completion)
        else:
            repository = self._repository(await self.follower.first()) or self._empty()
        await self._serve(repository)
        await self.heartbeat.beat()
        logger.info("batcher %s reading %d request streams", self.consumer, len(self.lanes))

    def _empty(self) -> Repository:
        return Repository(self.settings.repository.resolve(), {})

    def _repository(self, state: DesiredState) -> Repository | None:
        try:
            return state.repository(self.settings.repository.resolve())
        except ConfigError as exc:
            logger.error("cannot serve generation %d: %s", state.generation, exc)
            return None

    async def _follow(self, state: DesiredState) -> None:
        repository = self._repository(state)
        if repository is not None:
            await self._serve(repository)

    async def _serve(self, repository: Repository) -> None:
        """Lanes for what ``repository`` serves; the others retire once drained."""
        wanted: set[str] = set()
        for entry in repository:
            for version in () if entry.config.is_ensemble else entry.versions:
                stream = names.request_stream(entry.name, version)
                wanted.add(stream)
                lane = self.lanes.get(stream)
                if lane is None or lane.stamp != entry.stamp(version):
                    await self._add_lane(entry, version, lane)
        self.retiring = set(self.lanes) - wanted
        for stream in wanted:
            lane = self.lanes[stream]
            self.retirement.forget(lane.model, lane.version)
        self._watch()

    def _watch(self) -> None:
        """Trim and watch for cancel notices the streams of the lanes there are now."""
        self.trimmer.streams = list(self.routes)
        self.cancels.watch([lane.cancel_stream for lane in self.lanes.values()])

    def _noticed(self, stream: str, _: list[str]) -> None:
        for lane in self.lanes.values():
            if lane.cancel_stream == stream:
                lane.noticed()

    async def _add_lane(self, entry: ModelEntry, version: str, old: BatcherLane | None) -> None:
        lane = BatcherLane(
            self.send_link,
            self.group,
            entry,
            version,
            self.settings.work_conserving,
            self.settings.busy_hold_s,
            self.cancels.is_canceled,
            self.settings.free_probe_s,
            self.settings.share_hold,
        )
        lane.siblings = self.siblings
        await self.group.ensure([lane.request_stream, lane.credit_stream])
        if old is not None:
            lane.adopt_credits(old)
            self._stop_lane(old)
        elif lane.book is not None:
            await lane.book.recover(self.redis, time.monotonic())
        self.lanes[lane.request_stream] = lane
        if lane.book is None or (old is not None and old.request_stream in self.routes):
            self._read_lane(lane)  # a sequence model's once its lease is held (upkeep)
        self.dispatchers[lane] = self.tasks.spawn(
            self._dispatch(lane), f"dispatch {lane.request_stream}"
        )
        self.lanes_added.set()

    def _read_lane(self, lane: BatcherLane) -> None:
        self.routes[lane.request_stream] = (lane, False)
        self.routes[lane.credit_stream] = (lane, True)

    async def _lease_sequences(self) -> None:
        """Read a sequence model's streams while this batcher holds its lease, and only then."""
        for lane in list(self.lanes.values()):
            if lane.book is None or lane.request_stream in self.retiring:
                continue
            held = await self.lease.hold(lane.model, lane.version)
            if held and lane.request_stream not in self.routes:
                logger.info("batching the sequences of %s:%s", lane.model, lane.version)
                self._read_lane(lane)
            elif not held and lane.request_stream in self.routes:
                logger.warning("another batcher took the sequences of %s", lane.request_stream)
                self.routes.pop(lane.request_stream, None)
                self.routes.pop(lane.credit_stream, None)

    async def _dispatch(self, lane: BatcherLane) -> None:
        try:
            await lane.dispatch()
        finally:
            self.dispatchers.pop(lane, None)

    def _stop_lane(self, lane: BatcherLane) -> None:
        """The lane sends what it holds and ends; it reads nothing more."""
        lane.stop()

    async def _retire(self) -> None:
        for stream in sorted(self.retiring):
            lane = self.lanes[stream]
            if await self.retirement.may_go(lane.model, lane.version):
                logger.info("lane %s:%s retired", lane.model, lane.version)
                if lane.book is not None and stream in self.routes:  # its sequences end too
                    await self.redis.delete(names.sequence_states(lane.model, lane.version))
                    await self.lease.release(lane.model, lane.version)
                self.retiring.discard(stream)
                del self.lanes[stream]
                self.routes.pop(lane.request_stream, None)
                self.routes.pop(lane.credit_stream, None)
                self.retirement.forget(lane.model, lane.version)
                self._stop_lane(lane)
        self._watch()

    async def run(self) -> None:
        self.tasks.spawn(self.trimmer.run(self.settings.trim_interval_s, self.should_exit), "trim")
        self.tasks.spawn(self.heartbeat.run(), "heartbeat")
        log = LogControl(self.redis, self.settings.log_level, self.settings.log_settings_refresh_s)
        self.tasks.spawn(log.run(), "log settings")
        self.tasks.spawn(self.cancels.run(self.should_exit), "cancel notices")
        if self.settings.model_control_mode is not ControlMode.NONE:
            self.tasks.spawn(self.follower.run(self.should_exit), "follow desired state")
        await self._read_until_exit()
        # Intake has stopped; what the lanes hold still leaves, within the grace period.
        for lane in list(self.dispatchers):
            lane.stop()
        dispatchers = list(self.dispatchers.values())
        if dispatchers:
            await asyncio.wait(dispatchers, timeout=self.settings.shutdown_grace_s)

    async def _read_until_exit(self) -> None:
        # A read is never cancelled: entries it took are pending on this consumer, so
        # they must reach a lane. Exit waits at most one block_ms.
        next_upkeep = 0.0
        retry = RetryWait()
        while not self.should_exit.is_set():
            try:
                if time.monotonic() >= next_upkeep:
                    await self._upkeep()
                    next_upkeep = time.monotonic() + self.settings.reclaim_interval_s
                if not self.routes:
                    await self._await_lanes()
                    continue
                entries = await self.group.read(
                    self.read_link,
                    list(self.routes),
                    self.settings.read_count,
                    self.settings.block_ms,
                )
            except RedisError as exc:
                logger.warning("reading requests failed, retrying: %s", exc)
                await self.group.recover(exc, list(self.routes))
                await retry.failed()
                continue
            retry.succeeded()
            self._route(entries)
            if entries:
                # Let the lanes send what just arrived before the next read is packed and
                # sent: that read can wait, the batch is the latency.
                await asyncio.sleep(0)

    async def _await_lanes(self) -> None:
        """Nothing to read (a control mode serving no model yet): wait for a lane.

        A read of no streams returns at once without yielding, so looping on it would hold
        the event loop and starve the task that follows the desired state and adds lanes.
        """
        self.lanes_added.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.lanes_added.wait(), self.settings.block_ms / 1000)

    def _route(self, entries: list[Entry]) -> None:
        now_s = time.monotonic()
        for entry in entries:
            route = self.routes.get(entry.stream)
            if route is None:  # its lane retired while the read was out: a peer claims it
                logger.warning("entry %s of %s has no lane", entry.id, entry.stream)
                continue
            lane, is_credit = route
            if is_credit:
                lane.add_credit(entry)
            else:
                lane.add(entry, now_s)

    async def _upkeep(self) -> None:
        """Claim what dead batchers left pending; cap credits to the live instances."""
        await self._lease_sequences()
        for stream, (lane, _) in list(self.routes.items()):
            claimed = await self.reclaimer.claim(stream, self.settings.read_count, lane.held())
            if claimed.retry:
                logger.info(
                    "claimed %d entries of %s from dead batchers", len(claimed.retry), stream
                )
            self._route(claimed.retry)
        instances = served_instances(await live_consumers(self.redis, names.WORKER_GROUP))
        batchers = await live_consumers(self.redis, names.BATCHER_GROUP)
        others = len(batchers.keys() - {self.consumer})
        if (others > 0) != self.siblings:
            logger.info("%d other batchers share the request streams", others)
            self.siblings = others > 0
        idle = await self._idle_batch_streams()
        for lane in self.lanes.values():
            key = (lane.model, lane.version)
            lane.resync_credits(instances.get(key, 0), lane.batch_stream in idle)
            lane.siblings = self.siblings
        if self.retiring:
            await self._retire()

    async def _idle_batch_streams(self) -> set[str]:
        """Batch streams with nothing pending and nothing undelivered: their workers idle."""
        streams = [lane.batch_stream for lane in self.lanes.values()]
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xpending(stream, names.WORKER_GROUP)
                pipe.xinfo_groups(stream)
                pipe.xinfo_stream(stream)
            replies = await pipe.execute(raise_on_error=False)
        return {
            stream
            for stream, pending, groups, info in zip(
                streams, replies[::3], replies[1::3], replies[2::3], strict=True
            )
            if _idle(pending, groups, info)
        }

    async def shutdown(self) -> None:
        await self.tasks.cancel_all(self.settings.shutdown_grace_s)
        for lane in self.lanes.values():
            if lane.book is not None and lane.request_stream in self.routes:
                with contextlib.suppress(RedisError):  # else it expires
                    await self.lease.release(lane.model, lane.version)
        await self.heartbeat.stop()
        await self.read_link.close()
        await self.send_link.close()
        await self.cancels.close()
        await self.redis.aclose()


def _idle(pending: object, groups: object, info: object) -> bool:
    group = group_info(groups, names.WORKER_GROUP)
    if group is None or not isinstance(pending, dict) or not isinstance(info, dict):
        return False
    if pending.get("pending"):
        return False
    return bool(group.get("last-delivered-id") == info.get("last-generated-id"))
