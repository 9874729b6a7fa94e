"""Model config -> validated, hashable `ModelSpec`; mixer names and the mechanism cube.

Mixer names (`model.mixer`):
  softmax                      causal softmax attention with RoPE (the baseline)
  interdomain                  = dualkv-query-rope (the paper's full layer)
  s4d_only                     = generic-linear-norope (the paper's "vanilla S4D" control)
  <input>-<readout>-<rope>     any cube cell: input ∈ {dualkv, generic}, readout ∈ {query, linear},
                               rope ∈ {rope, norope}; e.g. generic-query-rope, dualkv-linear-norope
                               (readout `query`: Re(ξ(q)ᵀ U^H Γ); `linear`: S4D's Re(c·X), linear in the
                               state, then C_out; see idattn.layers.interdomain and docs/model.md)
  swa                          sliding-window causal softmax attention over the last `model.window` tokens
                               (Samba / RecurrentGemma style local attention, document-masked)
  <interdomain name>-<core>    the recurrence of a query-readout Interdomain mixer: core ∈ {selective,
                               selective+phase} (per-token Δ_t, and Mamba-3's rotation θ_t); no suffix = lti
                               (time invariant); e.g. interdomain-selective, dualkv-query-norope-selective+phase
                               (idattn.layers.interdomain, docs/model.md "Selective core")
  <query-readout name>-delta   the delta update on the key state (erase before write, β_t = s·σ(x_t·w_β)),
  <query-readout name>-delta2  after any core suffix: s = 1 (-delta) or s = 2 (-delta2, β ∈ (0, 2): negative
                               eigenvalues); e.g. interdomain-delta, interdomain-selective-delta2
                               (`mixer_delta`; docs/model.md "Delta core")
The name is the single source of truth: `model.input`, `model.readout` and `model.rope` must agree with it
(`apply_mixer_name` fills them); a disagreement is an error rather than a silently different model.

Hybrid stacks (`model.layer_pattern`, docs/model.md "Hybrid stacks"): a comma-separated list of mixer names,
repeated to the depth (layer i has mixer pattern[i mod P]; `num_layers` must be a multiple of P). Empty (the
default): every layer is `model.mixer`. A pattern whose entries are all the same name is that homogeneous model
exactly (same spec, parameter tree and loss). A mixed pattern gives family "hybrid" (`spec.mixer` stays
`model.mixer`, which no layer then uses); `layer_specs(spec)` returns one ModelSpec per pattern position (its
mixer, family and cube switches; every other field shared).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from idattn.layers.interdomain import CORES, INPUTS, READOUTS  # the layer owns its switches

ALIASES = {"interdomain": ("dualkv", "query", True), "s4d_only": ("generic", "linear", False)}
ATTENTION_FAMILIES = ("softmax", "swa")  # KV-cache mixers (swa: a ring buffer of model.window tokens)
S4D_INITS = ("inv", "lin", "legs", "inv_paper")
REMATS = ("none", "full", "dots")
DTYPES = ("float32", "bfloat16", "float16")
IMPLS = ("auto", "chunked", "sequential", "associative", "pallas")
# How the linear readout contracts the M modes of C_h into c_h (docs/model.md): mean (default) or sum.
LINEAR_CONTRACTIONS = ("mean", "sum")
# The delta update's mixer-name suffixes and the scale s of β_t = s·σ(x_t·w_β) each chooses (docs/model.md).
DELTA_SUFFIXES = {"delta": 1.0, "delta2": 2.0}


def cube_cells() -> list[str]:
    """The eight cells of the mechanism cube, as mixer names."""
    return [f"{i}-{r}-{p}" for i in INPUTS for r in READOUTS for p in ("rope", "norope")]


def mixer_delta(name: str) -> tuple[str, float]:
    """name -> (the name without its delta suffix, the scale s of β_t = s·σ(x_t·w_β)): "interdomain-delta2" ->
    ("interdomain", 2.0); a name without a delta suffix has s = 0 (no erase)."""
    base, _, last = str(name).rpartition("-")
    if base and last in DELTA_SUFFIXES:
        return base, DELTA_SUFFIXES[last]
    return str(name), 0.0


def mixer_core(name: str) -> tuple[str, str]:
    """name -> (the name without its core and delta suffixes, core): "interdomain-selective" -> ("interdomain",
    "selective"), "interdomain-selective-delta" -> ("interdomain", "selective"); a name without a core suffix has
    core "lti"."""
    name = mixer_delta(name)[0]
    base, _, last = str(name).rpartition("-")
    if base and last in CORES and last != "lti":
        return base, last
    return str(name), "lti"


def parse_mixer(name: str) -> tuple[str, str | None, str | None, bool | None]:
    """name -> (family, input, readout, rope); family ∈ {softmax, swa, interdomain}. A core suffix
    (`mixer_core`) is read by `mixer_core` and ignored here."""
    full = name
    name, core = mixer_core(name)
    if core != "lti" and name in ATTENTION_FAMILIES:
        raise ValueError(f"model.mixer: got {name}-{core!r}; the core suffix applies to Interdomain mixers only")
    if mixer_delta(full)[1] and name in ATTENTION_FAMILIES:
        raise ValueError(f"model.mixer: got {full!r}; the delta suffix applies to query-readout Interdomain mixers "
                         f"only")
    if name in ATTENTION_FAMILIES:
        return name, None, None, None
    if name in ALIASES:
        return ("interdomain", *ALIASES[name])
    parts = str(name).split("-")
    if len(parts) == 3 and parts[0] in INPUTS and parts[1] in READOUTS and parts[2] in ("rope", "norope"):
        return "interdomain", parts[0], parts[1], parts[2] == "rope"
    raise ValueError(f"model.mixer: got {name!r}; expected softmax, swa, interdomain, s4d_only or a cube cell "
                     f"<input>-<readout>-<rope> with input in {INPUTS}, readout in {READOUTS}, rope in "
                     f"(rope, norope), e.g. {', '.join(cube_cells()[:3])}")


def apply_mixer_name(model_cfg: Any, name: str) -> Any:
    """Set model.mixer = name and fill the cube switches (input, readout, rope) from it. Returns model_cfg."""
    family, inp, readout, use_rope = parse_mixer(name)
    model_cfg.mixer = name
    if family not in ATTENTION_FAMILIES:
        model_cfg.input, model_cfg.readout, model_cfg.rope = inp, readout, use_rope
    return model_cfg


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    mixer: str
    family: str
    input: str
    readout: str
    rope: bool
    output_gate: bool
    linear_contraction: str
    conj: bool
    theory: bool
    num_modes: int
    s4d_init: str
    kappa: float
    dt_min: float
    dt_max: float
    rope_base: float
    short_conv: int
    impl: str
    chunk_size: int
    norm_eps: float
    init_std: float
    dtype: str
    param_dtype: str
    scan_layers: bool
    remat: str
    attn_impl: str = "auto"
    layer_pattern: tuple = ()  # () = homogeneous (every layer `mixer`); else the mixer names of one group (hybrid)
    window: int = 0  # swa layers: attend to the last `window` tokens (the current one included)
    core: str = "lti"  # lti | selective | selective+phase: from the mixer name's suffix (`mixer_core`)
    delta_scale: float = 0.0  # s of the delta update's β_t = s·σ(x_t·w_β); 0 = none (`mixer_delta`)

    @property
    def out_std(self) -> float:
        """Residual output projections (W_O, SwiGLU down): 0.02/√(2·layers)."""
        return self.init_std / (2 * self.num_layers) ** 0.5

    def replace(self, **kw) -> "ModelSpec":
        return dataclasses.replace(self, **kw)


def _get(cfg, key, default=None):
    return cfg.get(key, default)  # dict and ConfigDict alike


def _err(key, seen, want, fix):
    return ValueError(f"model.{key}: got {seen!r}; expected {want}. {fix}")


def spec_from_config(model_cfg: Any) -> ModelSpec:
    """Validate `config.model` (ConfigDict or dict) and return a ModelSpec. Errors name key, value and fix."""
    if isinstance(model_cfg, ModelSpec):
        return model_cfg
    required = ("vocab_size", "d_model", "num_layers", "num_heads", "head_dim", "ffn_dim", "mixer")
    for k in required:
        if _get(model_cfg, k) is None:
            raise ValueError(f"model.{k} is missing; start from idattn.configs.base_config().model")
    g = lambda k, d=None: _get(model_cfg, k, d)  # noqa: E731
    mixer = str(g("mixer"))
    family, inp, readout, use_rope = parse_mixer(mixer)
    if family in ATTENTION_FAMILIES:
        inp, readout, use_rope = g("input", "dualkv"), g("readout", "query"), True
    else:
        for key, want in (("input", inp), ("readout", readout), ("rope", use_rope)):
            seen = g(key, want)
            if seen != want:
                raise _err(key, seen, f"{want!r} for mixer {mixer!r}",
                           "Choose the cell by name (e.g. --config.model.mixer=dualkv-query-norope) or call "
                           "idattn.models.apply_mixer_name(config.model, name) to fill the switches.")
    for k in ("vocab_size", "d_model", "num_layers", "num_heads", "head_dim", "ffn_dim", "num_modes",
              "short_conv", "chunk_size"):
        v = g(k, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise _err(k, v, "a positive integer", "Fix the value in the experiment config.")
    d, h, dh = g("d_model"), g("num_heads"), g("head_dim")
    if d % h:
        raise _err("num_heads", h, f"a divisor of d_model={d}", f"Pick num_heads with d_model % num_heads == 0 "
                   f"(e.g. {max(x for x in range(1, min(h, d) + 1) if d % x == 0)}).")
    if dh % 2:
        raise _err("head_dim", dh, "an even number (RoPE rotates pairs)", "Use an even head_dim.")
    checks = (("s4d_init", S4D_INITS), ("remat", REMATS), ("dtype", DTYPES), ("param_dtype", DTYPES),
              ("impl", IMPLS))
    for k, allowed in checks:
        v = g(k, allowed[0])
        if v not in allowed:
            raise _err(k, v, f"one of {allowed}", "Fix the value in the experiment config.")
    kappa = float(g("kappa", 0.25))
    if not kappa > 0:
        raise _err("kappa", kappa, "a positive decay bound (default 0.25)", "Fix the value.")
    dt_min, dt_max = float(g("dt_min", 1e-3)), float(g("dt_max", 1e-1))
    if not 0 < dt_min <= dt_max:
        raise _err("dt_min", (dt_min, dt_max), "0 < dt_min <= dt_max", "Fix model.dt_min / model.dt_max.")
    contraction = g("linear_contraction", "mean")
    if contraction not in LINEAR_CONTRACTIONS:
        raise _err("linear_contraction", contraction, f"one of {LINEAR_CONTRACTIONS}",
                   "mean: c_h = (1/M) 1ᵀ C_h (default); sum: c_h = 1ᵀ C_h (docs/model.md, the linear readout).")
    theory = bool(g("theory", False))
    pattern = parse_layer_pattern(g("layer_pattern", ""), g("num_layers"))
    window = g("window", 0)
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise _err("window", window, "a non-negative integer (tokens; > 0 where a layer is swa)",
                   "Set --config.model.window=<tokens>, e.g. 2048.")
    if window == 0 and "swa" in (pattern or (mixer,)):
        raise _err("window", window, "a positive number of tokens for the swa layers",
                   "Set --config.model.window=<tokens>, e.g. --config.model.window=2048.")
    if theory and any(parse_mixer(e)[:3] != ("interdomain", "dualkv", "query") for e in (pattern or (mixer,))):
        raise _err("theory", True, "False unless every layer is interdomain / dualkv-query-*",
                   "The LegS theory mode exists for the full layer only.")
    base = ModelSpec(
        vocab_size=g("vocab_size"), d_model=d, num_layers=g("num_layers"), num_heads=h, head_dim=dh,
        ffn_dim=g("ffn_dim"), mixer=mixer, family=family, input=inp, readout=readout, rope=bool(use_rope),
        output_gate=bool(g("output_gate", False)), linear_contraction=contraction, conj=bool(g("conj", True)), theory=theory,
        num_modes=g("num_modes", 64), s4d_init=g("s4d_init", "inv"), kappa=kappa, dt_min=dt_min, dt_max=dt_max,
        rope_base=float(g("rope_base", 10000.0)), short_conv=g("short_conv", 4), impl=g("impl", "auto"),
        chunk_size=g("chunk_size", 64), norm_eps=float(g("norm_eps", 1e-5)), init_std=float(g("init_std", 0.02)),
        dtype=g("dtype", "bfloat16"), param_dtype=g("param_dtype", "float32"),
        scan_layers=bool(g("scan_layers", True)), remat=g("remat", "full"), attn_impl=g("attn_impl", "auto"),
        window=window, core=_core_of(mixer, g("core", None), readout, theory),
        delta_scale=_delta_of(mixer, g("delta_scale", None), readout, theory))
    if not pattern:
        return base
    if len(set(pattern)) == 1:  # one type: exactly the homogeneous model of that mixer (same tree, same loss)
        return _layer_spec(base, pattern[0])
    return base.replace(family="hybrid", layer_pattern=pattern)  # `mixer` keeps model.mixer (unused by layers)


def parse_layer_pattern(value: Any, num_layers: int) -> tuple[str, ...]:
    """`model.layer_pattern` ("a,b,c", or a list / tuple from a saved config) -> the tuple of mixer names of one
    group; () when empty. Each entry must be a mixer name (`parse_mixer`) and the group length must divide
    `num_layers`; the refusal names the bad entry and its position."""
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        return ()
    items = [str(e).strip() for e in (value.split(",") if isinstance(value, str) else value)]
    for i, e in enumerate(items):
        try:
            parse_mixer(e)
        except ValueError:
            raise ValueError(f"model.layer_pattern: entry {i} is {e!r}; expected a mixer name (softmax, swa, "
                             f"interdomain, s4d_only or a cube cell <input>-<readout>-<rope>). Fix it, e.g. "
                             f"--config.model.layer_pattern=interdomain,interdomain,interdomain,softmax") from None
    if num_layers % len(items):
        fit = len(items) * max(1, num_layers // len(items))
        raise ValueError(f"model.layer_pattern: {len(items)} entries ({','.join(items)}) do not divide "
                         f"model.num_layers={num_layers}; expected a group length that divides the depth. Fix "
                         f"the pattern or num_layers (e.g. num_layers={fit}).")
    return tuple(items)


def model_label(model_cfg: Any) -> str:
    """What a run's model is called in logs, result files and tables: `model.mixer` for a homogeneous stack; for
    a hybrid, its repeated group, e.g. "hybrid[interdomain,interdomain,interdomain,softmax]", a windowed entry
    with its window ("swa@512"): two hybrids with the same recurrent mixer are different models, and a hybrid is
    never grouped with the homogeneous model of its `model.mixer`."""
    group = parse_layer_pattern(_get(model_cfg, "layer_pattern"), int(_get(model_cfg, "num_layers")))
    if not group:
        return str(_get(model_cfg, "mixer"))
    window = _get(model_cfg, "window")
    return "hybrid[" + ",".join(f"swa@{window}" if e == "swa" else e for e in group) + "]"


def _layer_spec(base: ModelSpec, name: str) -> ModelSpec:
    """The spec of one layer of mixer `name` in a stack described by `base` (every other field shared)."""
    family, inp, readout, use_rope = parse_mixer(name)
    if family in ATTENTION_FAMILIES:  # unused by attention; base_config's values, as a softmax config has them
        inp, readout, use_rope = "dualkv", "query", True
    return base.replace(mixer=name, family=family, input=inp, readout=readout, rope=bool(use_rope), layer_pattern=(),
                        core=_core_of(name, None, readout, base.theory),
                        delta_scale=_delta_of(name, None, readout, base.theory))


def _core_of(name: str, configured, readout, theory) -> str:
    """The core of mixer `name` (its suffix), checked against `model.core` when a config sets it and against the
    theory mode (which has no selective form)."""
    core = mixer_core(name)[1]
    if configured is not None and configured != core:
        raise _err("core", configured, f"{core!r} for mixer {name!r}",
                   "The core is the mixer name's suffix: e.g. --config.model.mixer=interdomain-selective.")
    if core == "lti":
        return core
    if theory:
        raise _err("mixer", name, "an S4D cell for a selective core (the theory mode's LegS basis has no selective "
                   "form)", "Use e.g. interdomain-selective or s4d_only-selective.")
    return core


def _delta_of(name: str, configured, readout, theory) -> float:
    """The delta update's scale s of mixer `name` (its suffix; 0 = none), checked against `model.delta_scale`
    when a config sets it (a saved spec does), and against the readout: the erase acts on the key state that a
    query reads, so the linear readout and the theory mode have none."""
    scale = mixer_delta(name)[1]
    if configured is not None and float(configured) != scale:
        raise _err("delta_scale", configured, f"{scale!r} for mixer {name!r}",
                   "The delta update is the mixer name's suffix: -delta (s = 1) or -delta2 (s = 2), e.g. "
                   "--config.model.mixer=interdomain-delta.")
    if scale and (readout != "query" or theory):
        raise _err("mixer", name, "a query-readout S4D cell for the delta update (it erases on the key state the "
                   "query reads; the linear readout and the theory mode have no delta form)",
                   "Use e.g. interdomain-delta or dualkv-query-norope-selective-delta2.")
    return scale


def layer_specs(spec: ModelSpec) -> tuple[ModelSpec, ...]:
    """One spec per position of the repeated group: (spec,) for a homogeneous model; for a hybrid, the spec of
    every pattern entry (layer i of the stack is layer_specs(spec)[i % P])."""
    if spec.family != "hybrid":
        return (spec,)
    return tuple(_layer_spec(spec, e) for e in spec.layer_pattern)


def conv_names(spec: ModelSpec) -> tuple[str, ...]:
    """Names of the short convolutions of a recurrent mixer (one [K, H, d_h] kernel each)."""
    if spec.family in ATTENTION_FAMILIES or spec.family == "hybrid":
        return ()
    names = ["conv_q"] if spec.readout == "query" else []
    names += ["conv_k"] if spec.input == "dualkv" else ["conv_1", "conv_2"]
    return tuple(names)
