"""Every config value the trainer reads, checked before anything is written (one line per refusal: the key, the
value, what was expected and the fix), plus the workdir and the prepared data shards.

`check_values(config)` covers the numeric ranges and the enumerations of `config.train` and `config.data`;
`check_workdir(workdir)` refuses a workdir that cannot be created or written (read-only mount, a file in the
way); `check_shards(config)` opens every prepared ArrayRecord shard and checks its record count against
`meta.json`, naming the damaged file.
"""
from __future__ import annotations

import math
import os
import tempfile

from idattn.configs import ConfigError




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
    v = _num(cfg, section, key)
    if v is not None and v not in choices:
        _fail(section, key, v, f"one of {tuple(choices)}", f"set --config.{section}.{key}={choices[0]}")


def check_values(config) -> None:
    """Raises ConfigError (one line) for the first out-of-range train / data value."""
    from idattn.data import pipeline
    from idattn.train import optim

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
    _int_at_least(config, "train", "decay_steps", -1)
    _real(config, "train", "decay_fraction", lo=0, hi=1, lo_open=True)
    _real(config, "train", "lease_heartbeat_s", lo=0, lo_open=True)
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
        from idattn.train import optim
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


def check_shards(config) -> None:
    """Prepared data: every listed shard opens and the record counts add up to meta.json's (file named)."""
    if str(config.data.get("source", "")) != "arrayrecord":
        return
    from array_record.python import array_record_module as ar

    from idattn.data import formats
    path = config.data.path
    meta = formats.read_meta(path)
    for split in ("train", "val"):
        total, bad = 0, []
        for shard in formats.shard_paths(path, meta, split):
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
        want = int(meta.get(f"{split}_docs", total))
        if bad:
            raise ConfigError(f"data shard {bad[0]} holds no readable records (truncated or not an ArrayRecord "
                              f"file{'; and ' + str(len(bad) - 1) + ' more' if len(bad) > 1 else ''}); copy it "
                              f"again or prepare the data again")
        if total != want:
            raise ConfigError(f"data.path={path}: the {split} shards hold {total} records but meta.json lists "
                              f"{want}; a shard is damaged or was replaced: prepare the data again")
