"""One jax story (issue 54 item 4): the accelerator extras follow the installed jax.

- setup.py: no extra names a runtime version of its own (jaxlib, libtpu, a CUDA plugin or its pjrt); each asks
  for jax's own extra (jax[tpu], jax[cuda12], ...) under install_requires' very jax requirement, so pip keeps the jax
  a plain install put there and `pip install -e ".[tpu]"` after `pip install -e .` changes no version;
- the installed jax's own extras pin jaxlib, libtpu and the CUDA plugins to exactly that jax (what setup.py relies
  on), and whatever runtime is installed here matches the installed jax (jaxlib, libtpu, plugins, pjrt).

The last check also runs without pytest, on any environment (.ci/run's newest-jax job runs it after the plain
install and after the tpu extra): `python tests/test_install_story.py` prints the versions and exits 1 on a
mismatch.
"""
import importlib.metadata as md
import os
import re
import sys

from packaging.requirements import Requirement
from packaging.version import Version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what must come at exactly jaxlib's version (a mismatched one refuses to load); only jax's own extras name them
RUNTIME = re.compile(r"^(jaxlib|libtpu(-nightly)?|jax-(cuda\d+|rocm\d*)-(plugin|pjrt))$")
# our accelerator extras -> the jax extras each must carry
ACCELERATOR_EXTRAS = {"tpu": {"tpu"}, "cuda12": {"cuda12"}, "cuda12-local": {"cuda12-local"},
                      "cuda13": {"cuda13"}, "cuda13-local": {"cuda13-local"},
                      "test": {"tpu", "cuda12-local"}}  # the ahead-of-time tests' TPU and CUDA compilers


def setup_kwargs() -> dict:
    """setup()'s arguments, read by running setup.py with setuptools.setup replaced (no build, no install)."""
    import setuptools
    seen = {}
    old = setuptools.setup
    setuptools.setup = lambda **kw: seen.update(kw)
    try:
        path = os.path.join(REPO, "setup.py")
        exec(compile(open(path).read(), path, "exec"), {"__name__": "__main__", "__file__": path})
    finally:
        setuptools.setup = old
    return seen


def _name(req: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", req.name).lower()


def test_extras_follow_the_installed_jax():
    kw = setup_kwargs()
    jax_reqs = [Requirement(r) for r in kw["install_requires"] if _name(Requirement(r)) == "jax"]
    assert len(jax_reqs) == 1 and not jax_reqs[0].extras and jax_reqs[0].marker is None, jax_reqs
    jax_spec = jax_reqs[0].specifier
    # the floor is a real lower bound (pip may keep any installed jax above it), not a pin
    assert all(s.operator == ">=" for s in jax_spec), f"install_requires pins jax ({jax_spec}): setup.py says why not"
    bad = []
    for extra, reqs in kw["extras_require"].items():
        for r in map(Requirement, reqs):
            if RUNTIME.match(_name(r)):
                bad.append(f"[{extra}] {r}: names a runtime version of its own; ask jax's extra for it instead")
            elif _name(r) == "jax" and r.specifier != jax_spec:
                bad.append(f"[{extra}] {r}: another jax requirement than install_requires' {jax_spec} (a second jax)")
    assert not bad, "\n".join(bad)
    for extra, want in ACCELERATOR_EXTRAS.items():
        got = set().union(*[Requirement(r).extras for r in kw["extras_require"][extra]
                            if _name(Requirement(r)) == "jax"])
        assert want <= got, f"[{extra}] should ask for jax{sorted(want)}, asks for jax{sorted(got)}"
    # deviceless compile in the test extra: the CUDA compilers, not the multi-GB runtime libraries
    assert not any("cuda12]" in r or "cuda13]" in r or "with-cuda" in r for r in kw["extras_require"]["test"])


def _jax_extra_requirements(extra: str) -> list[Requirement]:
    out = []
    for line in md.requires("jax") or []:
        r = Requirement(line)
        if r.marker is not None and "extra" in str(r.marker) and r.marker.evaluate({"extra": extra}):
            out.append(r)
    return out


def test_installed_jax_pins_its_runtime_to_itself():
    """The premise of setup.py: jax's own accelerator extras (those setup.py asks for) exist on the installed jax
    and pin jaxlib to exactly its version, with libtpu under tpu and the CUDA plugin under cuda*."""
    version = md.version("jax")
    provided = set(md.metadata("jax").get_all("Provides-Extra") or [])
    for extra in set().union(*ACCELERATOR_EXTRAS.values()):
        assert extra in provided, f"jax {version} has no [{extra}] extra (it provides {sorted(provided)})"
        reqs = {_name(r): r for r in _jax_extra_requirements(extra)}
        spec = {(s.operator, Version(s.version)) for s in reqs["jaxlib"].specifier} if "jaxlib" in reqs else set()
        exact = {("==", Version(version))} <= spec or {("<=", Version(version)), (">=", Version(version))} <= spec
        assert exact, f"jax {version}[{extra}] does not pin jaxlib to {version}: {reqs.get('jaxlib')}"
        runtime = "libtpu" if extra == "tpu" else f"jax-{extra.split('-')[0]}-plugin"
        assert runtime in reqs, f"jax {version}[{extra}] does not name {runtime}: {sorted(reqs)}"


def runtime_mismatches() -> list[str]:
    """Installed runtime packages that do not match the installed jax (empty: one consistent jax)."""
    def installed(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    jax_v = installed("jax")
    if jax_v is None:
        return ["jax is not installed"]
    out = []
    jaxlib_v = installed("jaxlib")
    if jaxlib_v != jax_v:
        out.append(f"jaxlib {jaxlib_v} with jax {jax_v}")
    for extra in ("tpu", "cuda12-local", "cuda13-local"):
        for r in _jax_extra_requirements(extra):
            v = installed(r.name)
            if v is not None and RUNTIME.match(_name(r)) and not r.specifier.contains(v, prereleases=True):
                out.append(f"{r.name} {v} with jax {jax_v} (jax[{extra}] wants {r})")
    for cuda in ("cuda12", "cuda13"):  # the plugin pins its pjrt
        plugin_v = installed(f"jax-{cuda}-plugin")
        pjrt_v = installed(f"jax-{cuda}-pjrt")
        if plugin_v is not None and pjrt_v != plugin_v:
            out.append(f"jax-{cuda}-pjrt {pjrt_v} with jax-{cuda}-plugin {plugin_v}")
    return out


def runtime_versions() -> str:
    names = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")
    found = []
    for n in names:
        try:
            found.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            pass
    return f"Python {sys.version_info[0]}.{sys.version_info[1]}: " + ", ".join(found)


def test_installed_runtime_matches_installed_jax():
    assert not runtime_mismatches(), f"{runtime_versions()}: {runtime_mismatches()}"


def test_readme_states_the_tested_jax():
    """The README names the jax versions CI tests: the floor of install_requires (on Python 3.11) and the newest."""
    jax = [Requirement(r) for r in setup_kwargs()["install_requires"] if _name(Requirement(r)) == "jax"][0]
    floor = str(jax.specifier).lstrip(">=")
    readme = open(os.path.join(REPO, "README.md")).read()
    assert f"jax {floor}" in readme and "Python 3.11" in readme and "newest jax" in readme


if __name__ == "__main__":
    print(runtime_versions())
    problems = runtime_mismatches()
    for p in problems:
        print("mismatch:", p)
    sys.exit(1 if problems else 0)
