"""One trainer per workdir: a lease file with a heartbeat (works where flock does not, e.g. NFS, gcsfuse).

`<workdir>/lease.json` = {"host", "pid", "start_time", "heartbeat", "beat", "heartbeat_s", "stale_s", "token",
"argv"}. Process 0 of a run creates it atomically (written whole to a temporary name, then hard-linked to
`lease.json`, which fails if the name exists; O_EXCL where links are not supported) before anything else is
written to the workdir, and a thread rewrites it every `heartbeat_s` seconds (`heartbeat` = the holder's clock,
`beat` += 1). Another trainer finding the lease is refused with who holds it, unless the lease is stale:

  - same host and the pid is gone (the holder was killed, e.g. SIGKILL or a crashed node restarted), or now
    belongs to another process (its start time differs from the one the lease recorded: a reused pid). A live,
    running pid on the same host is conclusive the other way: the lease is held whatever any clock says; only a
    stopped one (SIGSTOP, state T) is judged by age as below; or
  - the lease has not been renewed for the HOLDER's declared `stale_s` (written in the lease; the taker's own
    train.lease_stale_s never judges another trainer's lease, so a taker started with a small threshold cannot
    take a live run over). "Not renewed" is the age of the heartbeat by the taker's clock and the age of the
    lease file by its modification time on the shared filesystem, whichever is younger: a holder whose clock
    runs behind is not taken over early. A heartbeat from the future (the holder's clock ahead by more than
    CLOCK_SKEW_S) is not believed: the file's age decides alone, so such a lease expires `stale_s` after its
    last write. Only if the file's time is in the future too does the taker watch the lease for two of the
    holder's heartbeat periods (capped at WATCH_MAX_S) and take it when `beat` did not move.

Before judging a lease by age the taker measures its own clock against the shared filesystem (it writes a probe
file in the workdir and reads back its modification time, which the file server stamps): a clock that differs by
more than CLOCK_SKEW_S is refused in one line naming the skew and the fix (synchronise the clock), since every age
it would compute is off by that much (a clock an hour ahead once took over a live run). Within the bound, ages
are measured on the filesystem's clock (the probe's time), not the taker's.

A stale lease is taken over with a message (renamed aside first, so two trainers cannot both take it).

Fencing: the lease's `token` is the holder's fencing token. `check(what)` reads the lease file and raises
`LeaseLost` unless it still holds this trainer's token; the trainer calls it before every write it makes to the
workdir (checkpoint save and commit, metrics line, TensorBoard event, config, best/, eval/), so a trainer that was
stopped (SIGSTOP, a hung host) and then taken over stops at its next write without touching the new owner's
files. Its in-flight checkpoint is written under a temporary name of its own (`<step>.orbax-checkpoint-tmp-
<token>`, train/checkpoint.py) and its commit (the rename) is fenced the same way. The check and the write are
not one atomic operation: a holder stopped between the two for longer than `stale_s` can still make that one
write (no filesystem we target offers compare-and-swap on a rename); every later write is refused.
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
CLOCK_SKEW_S = 60.0  # a heartbeat further than this in the taker's future is not believed
WATCH_MAX_S = 120.0  # longest a taker watches a lease whose times are all in its future


MOVED = "the workdir {workdir} no longer exists (moved or deleted while the run trained)"


class LeaseHeld(RuntimeError):
    """Another live trainer holds the workdir."""


class ClockSkew(LeaseHeld):
    """This host's clock differs from the shared filesystem's by more than CLOCK_SKEW_S: a lease cannot be judged."""


class LeaseLost(RuntimeError):
    """This trainer's lease was taken over (or removed): it must not write to the workdir any more."""


def pid_alive(pid) -> bool:
    """True while process `pid` exists on this host, one of another user included (os.kill answers EPERM); False
    for a gone process or no pid (None, 0, not a number)."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process on this host, from /proc; None where
    /proc is not there (not Linux) or the process is gone."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3, starttime field 22
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def filesystem_skew(folder: str) -> float | None:
    """Seconds this host's clock is ahead of the filesystem's at `folder` (negative: behind), measured by writing
    a probe file and reading its modification time; None when the folder cannot be written."""
    probe = os.path.join(folder, f".clock-probe-{uuid.uuid4().hex[:12]}")
    try:
        before = time.time()
        with open(probe, "w") as f:
            f.write("probe")
        after = time.time()
        stamped = os.stat(probe).st_mtime
    except OSError:
        return None
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass
    # the stamp fell between before and after on a synchronised clock; coarse stamps (1-2 s) stay well inside the bound
    return (before + after) / 2 - stamped


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
    age = "unknown" if not hb else (f"{now - float(hb):.0f} s ago" if now >= float(hb) else
                                    f"{float(hb) - now:.0f} s in the future by this host's clock")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("start_time", 0) or 0)))
    return f"host {holder.get('host', '?')} pid {holder.get('pid', '?')} (started {started}, last heartbeat {age})"


def _declared_stale_s(holder: dict, default: float) -> float:
    """The holder's own threshold (written in its lease); leases from older versions carry none."""
    try:
        v = float(holder["stale_s"])
        return v if v > 0 else default
    except (KeyError, TypeError, ValueError):
        return default


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def stale_reason(path: str, holder: dict, *, own_token: str | None = None, default_stale_s: float = 600.0,
                 watch=None, skew: float | None = None) -> str | None:
    """Why the lease `holder` (read from `path`) may be taken over, or None while it is held (module docstring).
    `watch(seconds) -> bool`: True when the lease's `beat` did not move in that time (tests replace it).
    `skew`: this host's clock minus the filesystem's (None: measured here with a probe file; ClockSkew is raised
    when it exceeds CLOCK_SKEW_S)."""
    if holder.get("host") == socket.gethostname() and holder.get("pid") is not None:
        pid = int(holder["pid"])
        if not pid_alive(pid):
            return f"its process {pid} on this host is gone"
        stat = _proc_stat(pid)
        if stat is not None and holder.get("pid_start") is not None and stat[1] != int(holder["pid_start"]):
            return f"its process {pid} on this host is gone (the pid now belongs to another process)"
        if pid == os.getpid() and holder.get("token") != own_token:
            return None  # same process, another lease (a test running two trainers in one process): held
        if stat is None or stat[0] not in "Tt":
            return None  # a live, running process on this host holds it: conclusive, whatever the clocks say
    if skew is None:
        skew = filesystem_skew(os.path.dirname(path))
        if skew is not None and abs(skew) > CLOCK_SKEW_S:
            raise ClockSkew(
                f"this host's clock is {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the filesystem's "
                f"(measured by writing a file in {os.path.dirname(path)}), so the age of the lease held by "
                f"{describe(holder)} cannot be judged; nothing was written. Synchronise this host's clock (e.g. "
                f"`timedatectl set-ntp true` or `chronyc makestep`), then rerun")
    now = time.time() - (skew or 0.0)  # the filesystem's clock: ages of files it stamped are exact on it
    limit = _declared_stale_s(holder, default_stale_s)
    mtime = _mtime(path)
    if mtime is None:
        return "it vanished"
    file_age = now - mtime
    hb = holder.get("heartbeat")
    hb_age = None if hb is None else now - float(hb)
    why = f"(> its train.lease_stale_s={limit:g})"
    if hb_age is not None and hb_age < -CLOCK_SKEW_S:  # the holder's clock runs ahead: its heartbeat is no evidence
        if file_age >= -CLOCK_SKEW_S:
            if file_age > limit:
                return (f"its heartbeat is {-hb_age:.0f} s in the future (its host's clock runs ahead) and the "
                        f"lease file was last written {file_age:.0f} s ago {why}")
            return None
        hb_age = None  # the filesystem's time is in the future as well: watch the beat counter
    if hb_age is None and file_age < -CLOCK_SKEW_S:
        period = min(WATCH_MAX_S, 2 * float(holder.get("heartbeat_s", 30.0) or 30.0))
        unchanged = (watch or (lambda secs: _beat_unchanged(path, holder, secs)))(period)
        return (f"its times are in the future and it was not renewed in {period:.0f} s of watching"
                if unchanged else None)
    age = file_age if hb_age is None else min(hb_age, file_age)
    if age > limit:
        return f"it was last renewed {age:.0f} s ago {why}"
    return None


def _beat_unchanged(path: str, holder: dict, seconds: float) -> bool:
    time.sleep(seconds)
    now = _read(path)
    return bool(now) and now.get("token") == holder.get("token") and now.get("beat") == holder.get("beat")


def holder_alive(workdir: str) -> dict | None:
    """The record of the live trainer holding `workdir`'s lease, or None (no lease, or a stale one). For tools
    that look at a workdir without training in it (a sweep's status); never watches (no waiting)."""
    path = os.path.join(workdir, LEASE_FILE)
    holder = _read(path)
    if holder is None:
        return None
    if holder == {}:
        return {"host": "?", "pid": "?"}  # being written: someone is there
    return None if stale_reason(path, holder, watch=lambda s: False, skew=0.0) else holder


def _lost(path: str, token: str) -> str | None:
    """None while the lease file at `path` holds `token`; else who holds it now."""
    holder = _read(path)
    if holder == {}:  # being rewritten by the holder's heartbeat this instant: read again
        time.sleep(0.05)
        holder = _read(path)
    if holder and holder.get("token") == token:
        return None
    if holder is None and not os.path.isdir(os.path.dirname(path)):
        return MOVED.format(workdir=os.path.dirname(path))
    who = describe(holder) if holder else "nobody (the lease file was removed)"
    return f"the workdir lease {path} is now held by {who}"


class Fence:
    """The fencing check of a process that does not hold the lease itself but knows its token (a tool acting for
    a run): the same `check(what)` as `Lease.check`."""

    def __init__(self, workdir: str, token: str):
        self.path, self.token, self.lost = os.path.join(workdir, LEASE_FILE), token, None

    def check(self, what: str = "write") -> None:
        if self.lost is None:
            self.lost = _lost(self.path, self.token)
        if self.lost is not None:
            raise LeaseLost(f"{self.lost}; not writing ({what})")


class _NoFence:
    """Processes 1.. of a multi-process run: process 0 fences the run's writes (trainer.run says why)."""
    lost = None

    def check(self, what: str = "write") -> None:
        return None


NO_FENCE = _NoFence()


class Lease:
    def __init__(self, workdir: str, *, heartbeat_s: float = 30.0, stale_s: float = 600.0, log=print):
        self.path = os.path.join(workdir, LEASE_FILE)
        self.heartbeat_s, self.stale_s, self._log = float(heartbeat_s), float(stale_s), log
        self.token = uuid.uuid4().hex
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats = 0
        stat = _proc_stat(os.getpid())
        self._record = {"host": socket.gethostname(), "pid": os.getpid(), "start_time": time.time(),
                        "pid_start": stat[1] if stat else None, "heartbeat_s": self.heartbeat_s,
                        "stale_s": self.stale_s, "token": self.token, "argv": sys.argv[:8]}

    # --------------------------------------------------------------------------------------------- acquire
    def _stale_reason(self, holder: dict) -> str | None:
        return stale_reason(self.path, holder, own_token=self.token, default_stale_s=self.stale_s)

    def _create(self) -> bool:
        rec = dict(self._record, heartbeat=time.time(), beat=0)
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
                    f"another host, its lease expires {_declared_stale_s(holder, self.stale_s):g} s after its last "
                    f"renewal (the holder's train.lease_stale_s), or delete {self.path}.")
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
    def check(self, what: str = "write") -> None:
        """Raises LeaseLost unless the lease file still holds this trainer's token (the fencing check before a
        write to the workdir; one small file read)."""
        if self.lost is None:
            self.lost = _lost(self.path, self.token)
        if self.lost is not None:
            raise LeaseLost(f"{self.lost}; not writing ({what})")

    def _beat(self) -> None:
        holder = _read(self.path)
        if not holder or holder.get("token") != self.token:
            self.lost = _lost(self.path, self.token)
            return
        self._beats += 1
        rec = dict(self._record, heartbeat=time.time(), beat=self._beats)
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
