"""Every config value the trainer reads, checked before anything is written (one line per refusal: the key, the
value, what was expected and the fix), plus the workdir and the prepared data shards.

`check_values(config)` covers the numeric ranges and the enumerations of `config.train` and `config.data`;
`check_workdir(workdir)` refuses a workdir that cannot be created or written (read-only mount, a file in the
way); `check_shards(config)` opens every prepared ArrayRecord shard and checks its record count, size and SHA-256
against `meta.json` (and meta.json's token counts against the shards'), naming the damaged file.
"""
from __future__ import annotations

import difflib
import math
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from idattn.configs import ConfigError
from idattn.data import formats, pipeline
from idattn.data.prepare import reprepare_command
from idattn.train import optim, tracker


def _num(cfg, section: str, key: str):
    try:
        v = cfg[section][key]
    except (KeyError, AttributeError):
        return None
    return v


def _fail(section, key, value, expected, fix=None):
    fix = fix or f"set --config.{section}.{key}=<{expected}>"
    raise ConfigError(f"config.{section}.{key}={value!r}: expected {expected}; {fix}")


def _int_at_least(cfg, section, key, lo, fix=None):
    v = _num(cfg, section, key)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        _fail(section, key, v, f"an integer >= {lo}", fix)


def _real(cfg, section, key, *, lo=None, hi=None, lo_open=False, hi_open=False, fix=None):
    v = _num(cfg, section, key)
    if v is None:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    if ok and lo is not None:
        ok = float(v) > lo if lo_open else float(v) >= lo
    if ok and hi is not None:
        ok = float(v) < hi if hi_open else float(v) <= hi
    if not ok:
        lo_s = "" if lo is None else (f"> {lo:g}" if lo_open else f">= {lo:g}")
        hi_s = "" if hi is None else (f"< {hi:g}" if hi_open else f"<= {hi:g}")
        _fail(section, key, v, "a finite number " + " and ".join(x for x in (lo_s, hi_s) if x), fix)


def _choice(cfg, section, key, choices):
    """Refuses a value outside `choices`; the fix names the closest choice (a misspelling's intended value), else
    the first."""
    v = _num(cfg, section, key)
    if v is not None and v not in choices:
        near = difflib.get_close_matches(str(v), [str(c) for c in choices], n=1)
        _fail(section, key, v, f"one of {tuple(choices)}", f"set --config.{section}.{key}={(near or choices)[0]}")


def check_values(config) -> None:
    """Raises ConfigError (one line) for the first out-of-range train / data value."""
    _int_at_least(config, "train", "batch_size", 1)
    _int_at_least(config, "train", "grad_accum", 1)
    t = config.train
    if int(t.batch_size) % int(t.grad_accum):
        raise ConfigError(f"config.train.batch_size={t.batch_size} is not a multiple of config.train.grad_accum="
                          f"{t.grad_accum}; choose a grad_accum that divides the batch")
    _int_at_least(config, "train", "num_steps", -1)
    if int(t.num_steps) == 0:
        _fail("train", "num_steps", 0, "an integer >= 1 (or -1: derive from train.total_tokens)")
    _int_at_least(config, "train", "total_tokens", 0)
    _int_at_least(config, "train", "warmup_steps", -1)
    _int_at_least(config, "train", "warmup_tokens", 0)
    _real(config, "train", "peak_lr", lo=0, lo_open=True, fix="set --config.train.peak_lr=<positive>, e.g. 3e-3 "
          "(a negative LR would run gradient ascent)")
    _real(config, "train", "end_lr", lo=0)
    if float(t.end_lr) > float(t.peak_lr):
        raise ConfigError(f"config.train.end_lr={t.end_lr!r} is above config.train.peak_lr={t.peak_lr!r}; the "
                          f"schedule decays from peak to end: lower end_lr")
    _real(config, "train", "ssm_lr_cap", lo=0, lo_open=True)
    _real(config, "train", "weight_decay", lo=0)
    _real(config, "train", "grad_clip", lo=0, fix="set --config.train.grad_clip=<value >= 0> (0: no clipping)")
    _real(config, "train", "b1", lo=0, hi=1, hi_open=True)
    _real(config, "train", "b2", lo=0, hi=1, hi_open=True)
    _real(config, "train", "eps", lo=0, lo_open=True)
    _int_at_least(config, "train", "log_every", 1)
    _int_at_least(config, "train", "eval_every", 0)
    _int_at_least(config, "train", "eval_batches", 1)
    _int_at_least(config, "train", "checkpoint_every", 1)
    _int_at_least(config, "train", "keep_last", 1, fix="set --config.train.keep_last=<integer >= 1> (the "
                  "latest checkpoint is what a resume needs)")
    _int_at_least(config, "train", "keep_every", 0)
    _int_at_least(config, "train", "loss_chunk", 0)
    _int_at_least(config, "train", "max_bad_steps", 0)
    _choice(config, "train", "schedule", optim.SCHEDULES)
    _choice(config, "train", "wsd_shape", optim.WSD_SHAPES)
    tracker.check_tracker_config(t)
    _int_at_least(config, "train", "decay_steps", -1)
    _real(config, "train", "decay_fraction", lo=0, hi=1, lo_open=True)
    _real(config, "train", "lease_heartbeat_s", lo=0, lo_open=True)
    _real(config, "train", "stall_minutes", lo=0)
    _real(config, "train", "lease_stale_s", lo=0, lo_open=True)
    if float(t.get("lease_stale_s", 600)) <= 2 * float(t.get("lease_heartbeat_s", 30)):
        raise ConfigError(f"config.train.lease_stale_s={t.lease_stale_s!r} must exceed twice "
                          f"config.train.lease_heartbeat_s={t.lease_heartbeat_s!r}, or a live trainer looks dead")
    pinned = t.get("checkpoint_steps", ()) or ()
    if isinstance(pinned, (int, str)) or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in pinned):
        raise ConfigError(f"config.train.checkpoint_steps={pinned!r}: expected a tuple of steps >= 1, e.g. "
                          f"--config.train.checkpoint_steps='(400, 800)'")
    _int_at_least(config, "data", "seq_len", 1)
    _int_at_least(config, "data", "shuffle_seed", 0)
    if int(config.data.shuffle_seed) >= 2**32:
        _fail("data", "shuffle_seed", config.data.shuffle_seed, "an integer in [0, 2**32)")
    _int_at_least(config, "data", "num_workers", 0)
    _int_at_least(config, "data", "prefetch", 0)
    _real(config, "data", "val_fraction", lo=0, hi=1, hi_open=True)
    _choice(config, "data", "packing", pipeline.PACKING)
    if config.data.get("source"):  # unset: check_data_choice names the flags to add
        _choice(config, "data", "source", pipeline.SOURCES)


def check_warmup(config, num_steps: int, warmup_steps: int) -> None:
    t = config.train
    if int(t.warmup_steps) > num_steps:
        raise ConfigError(f"config.train.warmup_steps={t.warmup_steps} exceeds the {num_steps} steps of the run; "
                          f"set --config.train.warmup_steps=<at most {num_steps}>")
    if str(t.get("schedule", "cosine")) == "wsd":
        d = optim.decay_steps_of(t, num_steps)
        if warmup_steps + d > num_steps:
            raise ConfigError(f"config.train.schedule='wsd': warmup {warmup_steps} + decay {d} steps exceed the "
                              f"{num_steps} steps of the run; lower train.decay_steps / decay_fraction or warmup")


def check_workdir(workdir: str) -> None:
    """Refuses (one line) a workdir that cannot be created or written, before anything is written to it."""
    probe_dir = workdir
    while not os.path.exists(probe_dir):
        parent = os.path.dirname(probe_dir)
        if parent == probe_dir:
            break
        probe_dir = parent
    if not os.path.isdir(probe_dir):
        raise ConfigError(f"--workdir={workdir}: {probe_dir} is a file, not a folder; choose another --workdir")
    try:
        fd, path = tempfile.mkstemp(prefix=".idattn-write-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(path)
    except OSError as e:
        where = "the workdir" if probe_dir == workdir else f"{probe_dir} (where the workdir would be created)"
        raise ConfigError(f"--workdir={workdir}: cannot write to {where} ({e.strerror or e}); choose a writable "
                          f"--workdir or fix its permissions / mount") from e


# Shards are hashed at start by this many threads (hashlib releases the GIL; SHA-256 runs at ~1.5 GB/s a core
# with SHA-NI). At start rather than lazily at a shard's first read: the global shuffle draws every step's
# documents from all the shards, so the first step reads nearly every shard anyway (docs/data.md, "Checksums").
HASH_THREADS = 8
# A folder prepared before checksums were recorded: a split's token count is verified by reading every record
# (~250 MB/s of shard here, 6x slower than hashing) when its shards hold at most this many bytes, else not at all.
EXACT_COUNT_MAX_BYTES = 64 << 20
OLD_FOLDER_NOTE = "no checksums recorded (prepared by an older version)"


def _say(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def _reprepare(path, meta) -> str:
    return f"re-prepare the data ({reprepare_command(meta, path)})"


def _count_tokens(shards, itemsize: int) -> int:
    from array_record.python import array_record_module as ar  # local: array_record, not on model-only images
    tokens = 0
    for shard in shards:
        reader = ar.ArrayRecordReader(shard)
        try:
            n = int(reader.num_records())
            for lo in range(0, n, 4096):
                tokens += sum(len(r) for r in reader.read(list(range(lo, min(n, lo + 4096))))) // itemsize
        finally:
            reader.close()
    return tokens


def _hash_all(items) -> list[str]:
    if not items:
        return []
    with ThreadPoolExecutor(max(1, min(HASH_THREADS, os.cpu_count() or 1, len(items)))) as pool:
        return list(pool.map(formats.file_sha256, [shard for shard, _ in items]))


def check_shards(config) -> None:
    """Prepared data, before anything is written: every listed shard opens, the record counts add up to
    meta.json's, and (folders with checksums, formats.SHARDS) every shard's size, record count and SHA-256 are the
    ones prepare recorded; meta.json's train/val token counts must be the shards' (the recorded per-shard counts,
    or for an older folder the records themselves when small). One line per refusal, naming the file."""
    if str(config.data.get("source", "")) != "arrayrecord":
        return
    from array_record.python import array_record_module as ar  # local: array_record, not on model-only images

    path = config.data.path
    meta = formats.read_meta(path)
    table = formats.shard_table(meta)
    fix = _reprepare(path, meta)
    splits, to_hash = {}, []
    for split in ("train", "val"):
        total, bad, nbytes = 0, [], 0
        shards = formats.shard_paths(path, meta, split)
        for shard in shards:
            try:
                reader = ar.ArrayRecordReader(shard)
                n = int(reader.num_records())
                reader.close()
            except Exception as e:  # a garbage header
                raise ConfigError(f"data shard {shard} cannot be opened ({type(e).__name__}: {e}); it is damaged: "
                                  f"copy it again or prepare the data again") from e
            if n == 0:
                bad.append(shard)
            total += n
            size = os.path.getsize(shard)
            nbytes += size
            if table is not None:
                rec = table.get(os.path.basename(shard))
                if not isinstance(rec, dict) or not {"records", "tokens", "bytes", "sha256"} <= set(rec):
                    raise ConfigError(f"{path}/{formats.META}: its {formats.SHARDS!r} table has no complete entry "
                                      f"for {os.path.basename(shard)}; meta.json was edited or damaged: {fix}")
                if size != int(rec["bytes"]):
                    raise ConfigError(f"shard {shard}: its size is {size} bytes, meta.json recorded {rec['bytes']} "
                                      f"at prepare time; {fix} or restore the shard")
                if n != int(rec["records"]):
                    raise ConfigError(f"shard {shard}: it holds {n} records, meta.json recorded {rec['records']} at "
                                      f"prepare time; {fix} or restore the shard")
                to_hash.append((shard, str(rec["sha256"])))
        want = int(meta.get(f"{split}_docs", total))
        if bad:
            raise ConfigError(f"data shard {bad[0]} holds no readable records (truncated or not an ArrayRecord "
                              f"file{'; and ' + str(len(bad) - 1) + ' more' if len(bad) > 1 else ''}); copy it "
                              f"again or prepare the data again")
        if total != want:
            raise ConfigError(f"data.path={path}: the {split} shards hold {total} records but meta.json lists "
                              f"{want}; a shard is damaged or was replaced: prepare the data again")
        splits[split] = (shards, nbytes)
    t0 = time.perf_counter()
    for (shard, recorded), got in zip(to_hash, _hash_all(to_hash)):
        if got != recorded:
            raise ConfigError(f"shard {shard}: its SHA-256 is {got}, meta.json recorded {recorded} at prepare time; "
                              f"{fix} or restore the shard")
    dt = time.perf_counter() - t0
    itemsize = np.dtype(meta.get("dtype", "uint16")).itemsize
    uncounted = []
    for split, (shards, nbytes) in splits.items():
        if table is not None:
            have, how = sum(int(table[os.path.basename(s)]["tokens"]) for s in shards), "recorded per shard"
        elif nbytes <= EXACT_COUNT_MAX_BYTES:
            have, how = _count_tokens(shards, itemsize), "counted record by record"
        else:
            uncounted.append(split)
            continue
        said = meta.get(f"{split}_tokens")
        if said is None or isinstance(said, bool) or not isinstance(said, int) or said != have:
            raise ConfigError(f"data.path={path}: meta.json says {split}_tokens={said} but the {split} shards hold "
                              f"{have} tokens ({how}); meta.json or a shard changed after prepare: {fix}")
    if table is None:
        _say(f"note: data.path={path}: {OLD_FOLDER_NOTE}; its shards are not checked for changes"
             + (f" and its {'/'.join(uncounted)} token counts are not verified" if uncounted else "")
             + "; prepare it again (--overwrite) to record them")
    elif dt >= 1.0:
        gb = sum(os.path.getsize(shard) for shard, _ in to_hash) / 1e9
        _say(f"data.path={path}: {len(to_hash)} shards ({gb:.1f} GB) match the SHA-256 recorded at prepare time "
             f"(checked in {dt:.1f} s)")
