"""A pool of slots: jobs run on a thread per busy slot, and finish into one queue that the
driver (the only thread that writes the ledger) reads in the order they complete."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Done:
    slot: Any
    tag: Any  # what the driver gave submit (the proposal, its trial)
    kind: str  # "run" or "decide"
    result: Any = None
    error: BaseException | None = None


@dataclass
class Pool:
    slots: list
    busy: dict = field(default_factory=dict)  # slot name -> (kind, tag)
    done: "queue.Queue[Done]" = field(default_factory=queue.Queue)
    _queues: dict = field(default_factory=dict)  # slot name -> its thread's job queue

    def free(self) -> list:
        return [s for s in self.slots if s.name not in self.busy and not s.gone]

    def alive(self) -> list:
        return [s for s in self.slots if not s.gone]

    def submit(self, slot, kind: str, tag, fn: Callable[[Any], Any]) -> None:
        self.busy[slot.name] = (kind, tag)

        def go():
            try:
                self.done.put(Done(slot, tag, kind, fn(slot)))
            except BaseException as e:  # SlotLost, or a runner bug the driver re-raises
                self.done.put(Done(slot, tag, kind, error=e))

        # one long-lived thread per slot: a worker process dies with the thread that started
        # it (PR_SET_PDEATHSIG is per thread), so a slot's worker is always started from its
        # own thread, which lives as long as the pool
        q = self._queues.get(slot.name)
        if q is None:
            q = self._queues[slot.name] = queue.Queue()
            threading.Thread(target=self._serve, args=(q,), name=f"slot-{slot.name}", daemon=True).start()
        q.put(go)

    @staticmethod
    def _serve(q: "queue.Queue") -> None:
        while True:
            job = q.get()
            if job is None:
                return
            job()

    def wait(self, timeout: float | None = None) -> Done | None:
        try:
            d = self.done.get(timeout=timeout)
        except queue.Empty:
            return None
        self.busy.pop(d.slot.name, None)
        return d

    def close(self) -> None:
        """End the slots' threads (after their workers are closed: a worker dies with its thread)."""
        for q in self._queues.values():
            q.put(None)
