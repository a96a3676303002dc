"""The batches a lane has sent and not yet had a credit back for: when a free instance waits.

Work-conserving batching sends what is queued the moment an instance is free. With one
instance that is always right: otherwise it idles. With several instances beside a busy
one, it is not: on a CPU the instances share the worker's cores (on a GPU its SMs), so the
"free" instance's hardware is already busy, and a small batch sent to it computes at a far
worse cost per request than a full one (``wide_mlp`` on one thread: 3.4 ms of CPU per
sample at batch 16, 2.4 ms at 32, 2.0 ms at 64). In a closed loop the batches then split
unevenly (a batch of 30 in one instance, 4 in the other) and stay split.

So while another batch is in flight, a free instance waits for a batch as large as the
newest one in flight, for at most ``fraction`` of the batch time the lane has seen (from a
batch's send to its credit's return), and never past what the queue's own rule would send
anyway (a preferred size, a full batch). With every instance free it does not wait at all,
so a lightly loaded model still answers at once; ``fraction`` 0 turns the wait off.
"""

from __future__ import annotations

from collections import deque

# Weight of each new batch time in the running estimate.
_SMOOTHING = 0.2


class InFlight:
    """The sizes and send times of a lane's batches still computing, oldest first."""

    __slots__ = ("_sent", "batch_s", "fraction")

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self._sent: deque[tuple[float, int]] = deque()
        self.batch_s = 0.0  # running estimate of a batch's time, send to credit; 0: none yet

    def __len__(self) -> int:
        return len(self._sent)

    def sent(self, now_s: float, size: int) -> None:
        self._sent.append((now_s, size))

    def credited(self, now_s: float, credits: int) -> None:
        """``credits`` instances came free: the oldest batches in flight are done."""
        for _ in range(min(credits, len(self._sent))):
            sent_s, _size = self._sent.popleft()
            took_s = max(now_s - sent_s, 0.0)
            self.batch_s = (
                took_s if not self.batch_s else self.batch_s + _SMOOTHING * (took_s - self.batch_s)
            )

    def clear(self) -> None:
        """Every instance is known free (or the lane lost track): nothing is in flight."""
        self._sent.clear()

    def hold_until(
        self, now_s: float, oldest_s: float, queued_rows: int, credits: int, instances: int
    ) -> float | None:
        """Until when a free instance waits for more requests; None: send now.

        ``queued_rows`` is the batch the queue would send now; ``credits`` the free
        instances, ``instances`` the model's live ones.
        """
        if not self.fraction or instances <= 1 or credits >= instances or not self._sent:
            return None
        size = self._sent[-1][1]
        if queued_rows >= size:
            return None
        if now_s - self._sent[0][0] > 4 * self.batch_s + 1.0:
            self._sent.clear()  # a batch never credited (its worker died): stop waiting on it
            return None
        until_s = oldest_s + self.fraction * self.batch_s
        return until_s if until_s > now_s else None
