"""Running a pipeline through the mesh: a route's state in Redis, started and advanced.

Every step of a pipeline is an ordinary request to the step's model, so it passes through
that model's batcher and pool. The route's tensors live in one Redis hash per request (with
the request's deadline as its TTL): the gateway writes the pipeline's inputs and queues the
steps that are ready; the worker that finishes a step writes the step's outputs and, in the
same script call, learns which steps just became ready (all their inputs are in the hash)
and whether the request is complete. A step that several branches feed (fan-in) starts
once, when the last of them finishes, and no worker waits for it: each finished branch
only adds its tensors and asks. Each step start is claimed with a token derived from the
request that caused it, so a redelivered batch starts the same steps again (the gateway
drops the duplicate answers) and never a step twice for two different causes.

The script call that completes a request also reads its outputs and deletes the hash, and
a failed step's reply deletes it too: the TTL is only the backstop for requests that never
finish. A step that finishes after its route's hash is gone (answered, failed, or past its
deadline) adds nothing, so it neither brings the hash back nor answers twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from pipelines.graph import Pipeline, Plan, Step
from weir import names, wire
from weir.config import ModelConfig
from weir.stats import Stamp
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest

# KEYS[1]: the route hash. ARGV: ttl_ms, start (1: the gateway starts the route), n,
# n x (tensor, data), outputs count, outputs..., done token, then per candidate step:
# index, token, needs count, needs...
# Returns {the indexes of the steps to start, and -1 last when the request is complete;
# the outputs' data when it is complete}.
_ADVANCE = """
local key = KEYS[1]
if ARGV[2] == '0' and redis.call('EXISTS', key) == 0 then return {{}, {}} end
local i = 4
for _ = 1, tonumber(ARGV[3]) do
  redis.call('HSET', key, 't:' .. ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('PEXPIRE', key, ARGV[1])
local function claim(field, token)
  local owner = redis.call('HGET', key, field)
  if not owner then
    redis.call('HSET', key, field, token)
    return true
  end
  return owner == token
end
local function present(first, count)
  for j = first, first + count - 1 do
    if redis.call('HEXISTS', key, 't:' .. ARGV[j]) == 0 then return false end
  end
  return true
end
local outputs = tonumber(ARGV[i])
local first_output = i + 1
local complete = present(first_output, outputs)
i = i + 1 + outputs
local done_token = ARGV[i]
i = i + 1
local started = {}
while i <= #ARGV do
  local index, token, needs = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if present(i + 3, needs) and claim('s:' .. index, token) then
    table.insert(started, tonumber(index))
  end
  i = i + 3 + needs
end
if complete and claim('done', done_token) then
  local fields = {}
  for j = first_output, first_output + outputs - 1 do
    table.insert(fields, 't:' .. ARGV[j])
  end
  local values = redis.call('HMGET', key, unpack(fields))
  -- A step started in this same call still reads its inputs from the hash.
  if #started == 0 then redis.call('DEL', key) end
  table.insert(started, -1)
  return {started, values}
end
return {started, {}}
"""

# The token of the route's start: only the gateway may create a route's hash.
_START = "gateway"


@dataclass(frozen=True, slots=True)
class Route:
    """What a step request carries about the pipeline request it serves."""

    pipeline: str
    version: str
    request_id: str
    step: int
    outputs: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "version": self.version,
            "request_id": self.request_id,
            "step": self.step,
            "outputs": list(self.outputs),
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Route:
        return cls(raw["pipeline"], raw["version"], raw["request_id"], int(raw["step"]),
                   tuple(raw["outputs"]))  # fmt: skip


@dataclass
class Effects:
    """What advancing routes produced: step requests to queue and answers to send."""

    requests: list[tuple[InferRequest, int]] = field(default_factory=list)
    replies: list[tuple[str, bytes]] = field(default_factory=list)


def _pack(tensor: Tensor) -> bytes:
    return cast(bytes, msgpack.packb(tensor.to_wire(), use_bin_type=True))


def _unpack(raw: bytes) -> Tensor:
    return Tensor.from_wire(msgpack.unpackb(raw, raw=False))


class Router:
    """Starts and advances routes for the pipelines of one repository."""

    def __init__(self, redis: Redis, pipelines: dict[str, Pipeline]) -> None:
        self.redis = redis
        self.pipelines = pipelines
        self.script = redis.register_script(_ADVANCE)

    def step_request(
        self, parent: InferRequest, route: Route, step: Step, tensors: dict[str, Tensor]
    ) -> InferRequest:
        """The request that runs ``step`` for the pipeline request ``route`` serves."""
        return InferRequest(
            id=f"{route.request_id}/{step.index}",
            model=step.model,
            version=step.version,
            inputs=step.model_inputs(tensors),
            reply_to=parent.reply_to,
            deadline_ms=parent.deadline_ms,
            outputs=step.model_outputs,
            parameters={},
            ts={Stamp.GATEWAY_IN: wire.now_ns()},
            route=route.to_wire() | {"step": step.index},
            sequence=parent.sequence,  # each step of a sequence's request is in the sequence
        )

    def scheduled_config(self, config: ModelConfig) -> ModelConfig:
        """The config whose sequence rules a request meets: a pipeline's stateful step's."""
        pipeline = self.pipelines.get(config.name) if config.is_ensemble else None
        steps = pipeline.steps if pipeline is not None else []
        return next((s.config for s in steps if s.config.sequence_batching), config)

    async def start(self, request: InferRequest, plan: Plan, route: Route) -> Effects:
        """Write the pipeline inputs and find the first steps (one script call)."""
        produced = dict(request.inputs)
        return await self._advance_all([(request, route, plan, produced, _START)])

    async def advance(self, finished: list[tuple[InferRequest, InferReply]]) -> Effects:
        """Record finished steps and find what comes next, for a whole batch at once."""
        effects = Effects()
        work = []
        failed: list[str] = []
        for request, reply in finished:
            route = Route.from_wire(request.route or {})
            pipeline = self.pipelines[route.pipeline]
            step = pipeline.step(route.step)
            if reply.error is not None:
                effects.replies.append(_failure(request, route, step, reply))
                failed.append(names.route_state(route.request_id))
                continue
            plan = pipeline.plan(route.outputs)
            work.append((request, route, plan, step.pipeline_outputs(reply.outputs), request.id))
        more = await self._advance_all(work)
        effects.requests.extend(more.requests)
        effects.replies.extend(more.replies)
        await self._drop(failed)
        return effects

    async def _drop(self, keys: list[str]) -> None:
        """Delete failed requests' routes, after the steps started this batch read theirs."""
        if not keys:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:  # one DEL each: the keys lie on different cluster slots
                pipe.delete(key)
            await pipe.execute()

    async def _advance_all(self, work: list[tuple[Any, ...]]) -> Effects:
        calls = [
            self._script_call(route, plan, produced, token, request.deadline_ms)
            for request, route, plan, produced, token in work
        ]
        try:
            started = await self._run_scripts(calls)
        except NoScriptError:
            # Redis lost its script cache (a restart): load it again and run once more.
            await self.redis.script_load(_ADVANCE)
            started = await self._run_scripts(calls)
        return await self._follow(work, started)

    async def _run_scripts(self, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        # EVALSHA straight on the pipeline: redis-py's Script would first ask SCRIPT EXISTS,
        # a second round trip on every call. As a plain command, which a cluster's pipeline
        # routes by its key like any other (its evalsha method it refuses).
        async with self.redis.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.execute_command("EVALSHA", self.script.sha, len(keys), *keys, *args)
            return await pipe.execute()

    def _script_call(
        self, route: Route, plan: Plan, produced: dict[str, Tensor], token: str, deadline_ms: int
    ) -> tuple[list[str], list[Any]]:
        ttl_ms = max(deadline_ms - wire.now_ns() // 1_000_000, 1) + 1000
        args: list[Any] = [ttl_ms, int(token == _START), len(produced)]
        for name, tensor in produced.items():
            args.extend((name, _pack(tensor)))
        args.extend((len(plan.outputs), *plan.outputs, token))
        for step in plan.steps:
            if step.needs & produced.keys():
                args.extend((step.index, token, len(step.needs), *sorted(step.needs)))
        return [names.route_state(route.request_id)], args

    async def _follow(self, work: list[tuple[Any, ...]], results: list[list[Any]]) -> Effects:
        effects = Effects()
        fetches = []
        for (request, route, plan, _, _), (indexes, values) in zip(work, results, strict=True):
            pipeline = self.pipelines[route.pipeline]
            for index in indexes:
                if index < 0:  # complete: the script returned the outputs
                    effects.replies.append(_answer(request, route, plan, values))
                else:
                    step = pipeline.step(index)
                    fetches.append((request, route, step, tuple(step.needs)))
        if fetches:
            async with self.redis.pipeline(transaction=False) as pipe:
                for _, route, _, wanted in fetches:
                    pipe.hmget(names.route_state(route.request_id), [f"t:{t}" for t in wanted])
                values = await pipe.execute()
            effects.requests.extend(self._step_requests(fetches, values))
        return effects

    def _step_requests(
        self, fetches: list[tuple[Any, ...]], values: list[list[bytes]]
    ) -> list[tuple[InferRequest, int]]:
        requests = []
        for (request, route, step, wanted), raw in zip(fetches, values, strict=True):
            tensors = {name: _unpack(data) for name, data in zip(wanted, raw, strict=True)}
            batch = next(iter(tensors.values())).shape[0] if step.config.max_batch_size else 1
            requests.append((self.step_request(request, route, step, tensors), batch))
        return requests


def _answer(
    request: InferRequest, route: Route, plan: Plan, values: list[bytes]
) -> tuple[str, bytes]:
    tensors = {name: _unpack(data) for name, data in zip(plan.outputs, values, strict=True)}
    reply = InferReply(route.request_id, route.pipeline, route.version, tensors)
    return request.reply_to, reply.encode()


def _failure(
    request: InferRequest, route: Route, step: Step, reply: InferReply
) -> tuple[str, bytes]:
    kind, message = reply.error or ("internal", "")
    failed = InferReply(
        route.request_id, route.pipeline, route.version,
        error=(kind, f"pipeline '{route.pipeline}' {step.label} failed: {message}"),
    )  # fmt: skip
    return request.reply_to, failed.encode()
