"""One trainer per workdir: a lease file with a heartbeat (works where flock does not, e.g. NFS, gcsfuse).

`<workdir>/lease.json` = {"host", "pid", "start_time", "heartbeat", "token", "argv"}. Process 0 of a run creates
it atomically (written whole to a temporary name, then hard-linked to `lease.json`, which fails if the name
exists; O_EXCL where links are not supported) before anything else is written to the workdir, and a thread
rewrites `heartbeat` every `heartbeat_s` seconds. Another trainer finding the lease is refused with who holds it,
unless the lease is stale:

  - same host and the pid is gone (the holder was killed, e.g. SIGKILL or a crashed node restarted), or
  - the heartbeat is older than `stale_s` (the holder's host is gone or hung; default 10 minutes).

A stale lease is taken over with a message (renamed aside first, so two trainers cannot both take it). The
heartbeat thread checks that the lease still holds its own token: if another trainer took it over, `lost` is
set and the trainer stops before its next save rather than overwrite the other run's checkpoints.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid

LEASE_FILE = "lease.json"


class LeaseHeld(RuntimeError):
    """Another live trainer holds the workdir."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # being written or damaged: treated as held until it is stale by its mtime


def describe(holder: dict, now: float | None = None) -> str:
    now = time.time() if now is None else now
    hb = holder.get("heartbeat")
    age = f"{now - float(hb):.0f} s ago" if hb else "unknown"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("start_time", 0) or 0)))
    return f"host {holder.get('host', '?')} pid {holder.get('pid', '?')} (started {started}, last heartbeat {age})"


class Lease:
    def __init__(self, workdir: str, *, heartbeat_s: float = 30.0, stale_s: float = 600.0, log=print):
        self.path = os.path.join(workdir, LEASE_FILE)
        self.heartbeat_s, self.stale_s, self._log = float(heartbeat_s), float(stale_s), log
        self.token = uuid.uuid4().hex
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._record = {"host": socket.gethostname(), "pid": os.getpid(), "start_time": time.time(),
                        "token": self.token, "argv": sys.argv[:8]}

    # --------------------------------------------------------------------------------------------- acquire
    def _stale_reason(self, holder: dict) -> str | None:
        now = time.time()
        if holder.get("host") == socket.gethostname() and holder.get("pid") is not None:
            if not _pid_alive(int(holder["pid"])):
                return f"its process {holder['pid']} on this host is gone"
            if int(holder["pid"]) == os.getpid() and holder.get("token") != self.token:
                return None  # same process, another lease (a test running two trainers in one process): held
        hb = holder.get("heartbeat")
        if hb is None:
            try:
                hb = os.path.getmtime(self.path)
            except OSError:
                return "it vanished"
        if now - float(hb) > self.stale_s:
            return f"its heartbeat is {now - float(hb):.0f} s old (> train.lease_stale_s={self.stale_s:g})"
        return None

    def _create(self) -> bool:
        rec = dict(self._record, heartbeat=time.time())
        tmp = f"{self.path}.{self.token}.tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here: exclusive create instead
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                json.dump(rec, f)
            return True
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def acquire(self) -> "Lease":
        for _ in range(3):
            if self._create():
                self._start_heartbeat()
                return self
            holder = _read(self.path)
            if holder is None:
                continue  # released in between: try again
            reason = self._stale_reason(holder)
            if reason is None:
                raise LeaseHeld(
                    f"workdir {os.path.dirname(self.path)} is in use by another trainer: {describe(holder)}. "
                    f"Stop that run first (SIGTERM saves and exits), or use another --workdir; if it is dead on "
                    f"another host, its lease expires {self.stale_s:g} s after its last heartbeat "
                    f"(train.lease_stale_s), or delete {self.path}.")
            aside = f"{self.path}.stale-{self.token}"
            try:
                os.replace(self.path, aside)  # only one taker wins the rename of this exact file... see below
            except FileNotFoundError:
                continue
            moved = _read(aside) or {}
            if moved.get("token") != holder.get("token"):  # someone else replaced it in between: put it back
                try:
                    os.link(aside, self.path)
                except OSError:
                    pass
                os.unlink(aside)
                continue
            os.unlink(aside)
            self._log(f"taking over the workdir lease from {describe(holder)}: {reason}")
        if self._create():
            self._start_heartbeat()
            return self
        raise LeaseHeld(f"could not take the lease {self.path}: another trainer keeps taking it")

    # ------------------------------------------------------------------------------------------- heartbeat
    def _beat(self) -> None:
        holder = _read(self.path)
        if not holder or holder.get("token") != self.token:
            who = describe(holder) if holder else "nobody (the lease file was removed)"
            self.lost = f"the workdir lease {self.path} is now held by {who}"
            return
        rec = dict(self._record, heartbeat=time.time())
        tmp = f"{self.path}.{self.token}.tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self._beat()
            except OSError as e:  # a full or read-only disk: the trainer's own save check reports it
                print(f"warning: lease heartbeat failed: {e}", file=sys.stderr, flush=True)
            if self.lost:
                return

    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._run, name="idattn-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        holder = _read(self.path)
        if holder and holder.get("token") == self.token:
            try:
                os.unlink(self.path)
            except OSError:
                pass
