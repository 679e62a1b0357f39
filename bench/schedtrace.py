"""Where the threads of a closed loop wait, from a Linux scheduler trace (``bench/PROFILE.md`` round 16).

    perf record -a -g -e sched:sched_switch -e sched:sched_wakeup -o /tmp/s.data -- sleep 2
    python bench/schedtrace.py /tmp/s.data main=<loop tid> child=<writer pid> gen=<load pid> ...

Each named thread's time is split into running (``R:run``), waiting for a core (``W:preempted``:
taken off it, ``W:woken``: woken, not yet on one) and sleeping, by where it went to sleep (the
kernel stack at the switch: ``epoll``, ``futex`` (for a Python thread: mostly the interpreter
lock), ``disk`` (ext4/jbd2, ``D:`` uninterruptible), ``pipe_read``...). Then the cores' idle time:
how much of it passed while a named thread was runnable and waiting on the other core's queue
(the scheduler left a core idle with work waiting), by what the busy core ran, and the longest
such stretches. Needs root (or ``perf_event_paranoid`` <= 0) to record; reading is ``perf script``.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess

_HEAD = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):")


def _reason(stack: list[str], state: str) -> str:
    s = " ".join(stack)
    for key, found in (
        ("do_epoll_wait", "epoll"),
        ("futex", "futex"),
        ("pipe_read", "pipe_read"),
        ("pipe_write", "pipe_write"),
        ("do_sys_poll", "poll"),
        ("do_select", "poll"),
        ("nanosleep", "sleep"),
    ):
        if key in s:
            name = found
            break
    else:
        name = "disk" if ("ext4" in s or "jbd2" in s or "vfs_write" in s) else "other"
    return ("D:" if state.startswith("D") else "") + name


class Trace:
    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.state: dict[int, tuple[str, float, str]] = {}
        self.acc: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.cpu: dict[int, int] = {}
        self.idle: dict[str, float] = collections.defaultdict(float)
        self.busy_with: collections.Counter[tuple[str, ...]] = collections.Counter()
        self.long: list[tuple[float, float, list[str], dict[int, str]]] = []
        self.t0: float | None = None
        self.last: float | None = None

    def _advance(self, t: float) -> None:
        if self.last is not None and t > self.last:
            dt = t - self.last
            idle = sum(1 for p in self.cpu.values() if p == 0)
            waiting = sorted(self.names[x] for x, st in self.state.items() if st[0] == "W")
            self.idle["idle"] += idle * dt
            if idle and waiting:
                self.idle["idle while a named thread waits for a core"] += idle * dt
                for w in waiting:
                    self.idle[f"  ... {w} waits"] += idle * dt
                ran = tuple(sorted(self.names.get(p, "other") if p else "idle" for p in self.cpu.values()))
                self.busy_with[ran] += dt
                if dt > 0.0008:
                    where = {c: self.names.get(p, str(p)) if p else "idle" for c, p in self.cpu.items()}
                    self.long.append((self.last - (self.t0 or 0.0), dt, waiting, where))
        self.last = t

    def _set(self, tid: int, st: str, t: float, why: str) -> None:
        old = self.state.get(tid)
        if old is not None:
            self.acc[(self.names[tid], f"{old[0]}:{old[2]}")] += t - old[1]
        self.state[tid] = (st, t, why)

    def event(self, head: str, stack: list[str]) -> None:
        m = _HEAD.search(head)
        if not m:
            return
        cpu, t, ev = int(m.group(1)), float(m.group(2)), m.group(3)
        if self.t0 is None:
            self.t0 = t
        self._advance(t)
        if ev == "sched_switch":
            prev = int(re.search(r"prev_pid=(\d+)", head).group(1))  # type: ignore[union-attr]
            state = re.search(r"prev_state=(\S+)", head).group(1)  # type: ignore[union-attr]
            nxt = int(re.search(r"next_pid=(\d+)", head).group(1))  # type: ignore[union-attr]
            self.cpu[cpu] = nxt
            if prev in self.names:
                if state.startswith("R"):
                    self._set(prev, "W", t, "preempted")
                else:
                    self._set(prev, "S", t, _reason(stack, state))
            if nxt in self.names:
                self._set(nxt, "R", t, "run")
        elif ev == "sched_wakeup":
            pid = int(re.search(r" pid=(\d+)", head).group(1))  # type: ignore[union-attr]
            if pid in self.names and self.state.get(pid, ("S",))[0] == "S":
                self._set(pid, "W", t, "woken")

    def report(self) -> None:
        assert self.t0 is not None and self.last is not None
        for tid, (st, _, why) in list(self.state.items()):
            self._set(tid, st, self.last, why)
        wall = self.last - self.t0
        print(f"{wall:.3f} s traced; share of the wall time:")
        by: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
        for (name, st), v in self.acc.items():
            by[name].append((v, st))
        for name in sorted(by):
            parts = [
                f"{st} {v / wall * 100:.1f}%" for v, st in sorted(by[name], reverse=True) if v / wall > 0.002
            ]
            print(f"  {name:8s} " + "  ".join(parts))
        print("cores idle (% of one core's time):")
        for k, v in self.idle.items():
            print(f"  {k}: {v / wall * 100:.1f}%")
        top = [(k, round(v / wall * 100, 1)) for k, v in self.busy_with.most_common(5)]
        print("  while so, the cores ran:", top)
        print("  the first stretches over 0.8 ms (ms into the trace, ms, waiting, core -> thread):")
        for at, dt, waiting, where in self.long[:12]:
            print(f"    {at * 1e3:8.2f}  {dt * 1e3:5.2f}  {','.join(waiting):14s} {where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="perf.data of sched_switch and sched_wakeup, recorded with -a -g")
    ap.add_argument("threads", nargs="+", help="name=tid (a thread id; a process's main thread is its pid)")
    args = ap.parse_args()
    names = {int(v): k for k, v in (a.split("=", 1) for a in args.threads)}
    out = subprocess.run(
        ["perf", "script", "-i", args.data, "-F", "comm,tid,cpu,time,event,trace,ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tr = Trace(names)
    for block in out.split("\n\n"):
        lines = [line for line in block.strip().split("\n") if line.strip()]
        if lines:
            tr.event(lines[0], [(line.split() + ["", ""])[1] for line in lines[1:]])
    tr.report()


if __name__ == "__main__":
    main()
