"""`run_app(main)`: absl's `app.run` for the config-file CLIs, with `--config.<key>=<value>` mistakes as one line.

ml_collections' config flags resolve an override key while absl parses the flags; an unknown key raises an
AttributeError wrapping a KeyError whose text is itself a repr, so the user saw
`AttributeError: '\\'num_step\\'\\nDid you mean "num_steps" instead of "num_step"?'` under a traceback. Here the
same mistake prints

    error: --config.train.num_step=5: config.train has no key 'num_step'; did you mean 'num_steps'? ...

and exits with status 2, before anything runs. A value of the wrong type is one line too (exit 2), with the key,
the value, the reason and the type the config holds there, where absl printed it under `FATAL Flags parsing error`
followed by a help hint (which was all a launcher's dry run showed of it):

    error: --config.train.num_steps=ten: invalid literal for int() with base 10: 'ten'; give config.train.num_steps
    an int (the config has 200)

Errors raised by `main` itself pass through untouched.
"""
from __future__ import annotations

import re
import sys
import textwrap
import traceback

from absl import app, flags
from ml_collections import config_flags

from idattn.configs import resolve_argv


def _from_flag_parsing(exc: BaseException) -> bool:
    """True when the exception was raised while absl parsed the command line (not inside main)."""
    files = [f.filename.replace("\\", "/") for f in traceback.extract_tb(exc.__traceback__)]
    return any("ml_collections/config_flags" in f for f in files)


def _missing_key(exc: BaseException) -> str | None:
    text = str(exc)
    m = re.search(r"'\\?'?([A-Za-z_][A-Za-z0-9_]*)\\?'?", text)
    return m.group(1) if m else None


def config_flag_error(exc: BaseException, argv: list[str]) -> str | None:
    """The one-line message for a bad `--config.<key>` override, or None when `exc` is not one."""
    key = _missing_key(exc)
    if key is None:
        return None
    flags = [a for a in argv if a.startswith("--config.")]
    flag = next((a for a in flags if re.search(rf"(^--config\.|\.){re.escape(key)}(=|\.|$)", a)), None)
    if flag is None:
        return None
    path = flag.split("=", 1)[0][len("--"):]
    parent = path[: path.rfind("." + key)] if ("." + key) in path else "config"
    hint = re.search(r'Did you mean "([^"]+)"', str(exc).replace('\\"', '"'))
    near = hint.group(1) if hint else None
    msg = f"error: {flag}: {parent} has no key {key!r}"
    if near:
        return msg + f"; did you mean {near!r} ({flag.replace(key, near, 1).split('=')[0]})?"
    return msg + "; run with --helpfull to list the flags, or see the config file for its keys."


def config_value_error(exc: BaseException) -> str | None:
    """The one-line message for a `--config.<key>=<value>` override whose value does not parse (absl's
    IllegalFlagValueError), or None when `exc` is not one."""
    m = re.match(r"flag --(config\.[A-Za-z0-9_.]+)=(.*?): (.*)$", str(exc), re.S)
    if m is None:
        return None
    path, value, reason = m.group(1), m.group(2), " ".join(m.group(3).split())
    msg = f"error: --{path}={value}: {reason}"
    holder = flags.FLAGS["config"] if "config" in flags.FLAGS else None
    node = getattr(holder, "value", None)
    try:
        for part in path.split(".")[1:]:
            node = node[part]
    except (KeyError, TypeError, AttributeError):
        return msg
    if node is None:
        return msg
    kind = type(node).__name__
    return msg + f"; give {path} {'an' if kind[0] in 'aeiou' else 'a'} {kind} (the config has {node!r})"


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's `parse_flags_with_usage`, with a bad `--config.<key>` value as one line (exit status 2)."""
    try:
        return flags.FLAGS(argv)
    except flags.IllegalFlagValueError as e:
        msg = config_value_error(e)
        if msg is not None:
            print(msg, file=sys.stderr, flush=True)
            sys.exit(2)
        error = e
    except flags.Error as e:
        error = e
    message = str(error)  # as absl.app.parse_flags_with_usage prints it
    message = f"\n{textwrap.indent(message, '  ')}\n" if "\n" in message else f" {message}\n"
    sys.stderr.write(f"FATAL Flags parsing error:{message}")
    sys.stderr.write("Pass --helpshort or --helpfull to see help on flags.\n")
    sys.exit(1)


def run_app(main, argv=None) -> None:
    """`absl.app.run(main)`; a mistyped `--config.<key>` or a value of the wrong type is reported on one line
    (exit status 2)."""
    if argv is None:
        sys.argv[:] = resolve_argv(sys.argv)  # packaged recipes from any folder (idattn.configs)
    else:
        argv = resolve_argv(list(argv))
    try:
        app.run(main, argv=argv, flags_parser=_parse_flags)
    except (AttributeError, KeyError) as e:
        if not _from_flag_parsing(e):
            raise
        msg = config_flag_error(e, list(argv if argv is not None else sys.argv))
        if msg is None:
            raise
        print(msg, file=sys.stderr)
        sys.exit(2)


def define_model_flags():
    """Define `--config` (an experiment config; a random-init model when no --workdir), `--workdir` (a run
    directory with checkpoints) and `--step` (which checkpoint; `step_flag` parses it): the model source of `idattn.rundir.loading.load_model`, shared by the score,
    generate and export CLIs. Returns the config flag holder.

    Call it when run as a CLI, never at import: two modules defining `--config` in one process (e.g. one pytest
    worker importing several CLIs' library functions) raise absl's DuplicateFlagError."""
    config = config_flags.DEFINE_config_file("config", None, "experiment config (random init)", lock_config=False)
    flags.DEFINE_string("workdir", None, "run directory with checkpoints")
    flags.DEFINE_string("step", None, "with --workdir: the checkpoint step (default: the latest committed; 'best': "
                        "the best-of-run parameters)")
    return config


def step_flag(value: str | None):
    """--step as load_params takes it: None (latest), "best", or an int; one-line error otherwise."""
    if value in (None, "", "best"):
        return value or None
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"error: --step={value!r}: expected a checkpoint step (an integer) or 'best'") from None
