"""The package stands on its own: it never reaches into the repository tree, and a normal (non-editable) wheel
install runs the documented commands from an unrelated folder.

- (default) no module of `idattn` imports `experiments`, `launch` or `tests`, or names those folders in a path;
  `experiments/*.py` and `launch/*.py` are re-exports of the packaged recipes and launchers;
- (default) the rooms import only downward (ROOMS below, docs/architecture.md), there is no import cycle, and no
  module imports another's private (`_name`) names; a command's `if __name__ == "__main__":` block is its entry
  and is exempt (it runs only as the program, never at import);
- (slow) `git clone` of this checkout's HEAD, `pip install <clone>[tpu]` into a fresh venv, then from a temporary
  folder: idattn.train on a packaged config, the quickstart (2 steps of one model), `idattn.repro ppl --toy`,
  `idattn.bench op` and `idattn.aot`.
"""
import ast
import glob
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE_FOLDERS = ("experiments", "launch", "tests")


def _package_files():
    return sorted(glob.glob(os.path.join(REPO, "idattn", "**", "*.py"), recursive=True))


def test_package_never_reaches_into_the_repository_tree():
    bad = []
    for path in _package_files():
        tree = ast.parse(open(path).read(), path)
        rel = os.path.relpath(path, REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad += [(rel, a.name) for a in node.names if a.name.split(".")[0] in TREE_FOLDERS]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in TREE_FOLDERS:
                    bad.append((rel, node.module))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TREE_FOLDERS:
                bad.append((rel, f"path component {node.value!r}"))
    # the one allowed mention: resolve_config_arg strips an "experiments/" prefix to find the packaged recipe
    bad.remove(("idattn/configs/__init__.py", "path component 'experiments'"))
    assert not bad, bad


# Rooms, bottom to top: a module may import its own room and the rooms below it. The first matching prefix wins.
ROOMS = [
    ("io", ("idattn.atomic",)),  # whole-or-nothing file writes: below everything that writes a file
    ("ops", ("idattn.ops",)),
    ("layers", ("idattn.layers",)),
    ("models", ("idattn.models",)),
    ("configs", ("idattn.configs",)),
    ("data", ("idattn.data",)),
    ("rundir", ("idattn.rundir",)),
    ("train", ("idattn.train",)),
    ("eval", ("idattn.eval",)),
    ("studies", ("idattn.studies",)),
    ("tools", ("idattn.aot", "idattn.bench", "idattn.launch")),
    ("commands", ("idattn",)),  # the top-level modules: thin entries (argv -> one library call)
]
# Commands inside a room (argv parsing around that room's library); they sit at the commands level.
COMMANDS = ("idattn.train.__main__", "idattn.eval.__main__")


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _room(module: str) -> int:
    if module in COMMANDS:
        return len(ROOMS) - 1
    for i, (_, prefixes) in enumerate(ROOMS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module}: in no room; add it to ROOMS")


def _is_main_guard(node) -> bool:
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in t.comparators))


def _imports(path: str, modules: set[str]):
    """(target module, imported names, line) of every idattn import outside `if __name__ == "__main__":`, plus
    (module alias -> target) for attribute use (`pipeline._private`)."""
    name = _module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    tree = ast.parse(open(path).read(), path)
    skip = {id(n) for top in tree.body if _is_main_guard(top) for n in ast.walk(top)}
    out, aliases = [], {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("idattn"):
                    out.append((a.name, [], node.lineno))
                    if a.asname:
                        aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if not base.startswith("idattn"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules:  # `from idattn.train import checkpoint`: a module, not a name
                    out.append((sub, [], node.lineno))
                    aliases[a.asname or a.name] = sub
                else:
                    out.append((base, [a.name], node.lineno))
    private_attrs = [(aliases[n.value.id], n.attr, n.lineno) for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases
                     and n.attr.startswith("_") and not n.attr.startswith("__")]
    return out, private_attrs


def _graph():
    files = {_module_name(p): p for p in _package_files()}
    return files, {m: _imports(p, set(files)) for m, p in files.items()}


def test_rooms_import_only_downward_without_cycles_or_private_names():
    files, graph = _graph()

    def resolve(target):  # a name imported from a package resolves to the package module
        while target not in files and "." in target:
            target = target.rpartition(".")[0]
        return target

    upward, private, edges = [], [], {m: set() for m in files}
    for m, (imports, private_attrs) in graph.items():
        for target, names, line in imports:
            t = resolve(target)
            if t != m:
                edges[m].add(t)
            if _room(t) > _room(m):
                upward.append(f"{files[m]}:{line}: {m} ({ROOMS[_room(m)][0]}) imports {t} ({ROOMS[_room(t)][0]})")
            private += [f"{files[m]}:{line}: {m} imports {t}.{n}" for n in names
                        if n.startswith("_") and not n.startswith("__") and t != m]
        private += [f"{files[m]}:{line}: {m} uses {t}.{a}" for t, a, line in private_attrs if t != m]
    cycles, state = [], {}

    def visit(node, stack):  # depth-first search; a back edge closes a cycle
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for m in sorted(files):
        if m not in state:
            visit(m, [m])
    assert not upward, "imports against the room order:\n" + "\n".join(upward)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert not private, "private names across modules:\n" + "\n".join(private)


def test_the_layout_checker_catches_what_it_forbids(tmp_path, monkeypatch):
    """The checker itself can fail: an upward import, a cycle and a private name in a fake package are named."""
    pkg = tmp_path / "idattn"
    for sub in ("ops", "train"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "a.py").write_text("from idattn.train import b\n")
    (pkg / "train" / "b.py").write_text("from idattn.ops.a import _helper\nimport idattn.ops.a\n")
    (pkg / "train" / "c.py").write_text('if __name__ == "__main__":\n    from idattn.studies import x\n')
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    with pytest.raises(AssertionError) as e:
        test_rooms_import_only_downward_without_cycles_or_private_names()
    msg = str(e.value)
    assert "idattn.ops.a (ops) imports idattn.train.b (train)" in msg, msg
    monkeypatch.setattr(sys.modules[__name__], "ROOMS", [("all", ("idattn",))])
    with pytest.raises(AssertionError) as e:
        test_rooms_import_only_downward_without_cycles_or_private_names()
    assert "idattn.ops.a -> idattn.train.b -> idattn.ops.a" in str(e.value), str(e.value)
    (pkg / "ops" / "a.py").write_text("")
    with pytest.raises(AssertionError) as e:
        test_rooms_import_only_downward_without_cycles_or_private_names()
    assert "imports idattn.ops.a._helper" in str(e.value) and "studies" not in str(e.value), str(e.value)


@pytest.mark.parametrize("folder, package", [("experiments", "idattn.configs"), ("launch", "idattn.launch")])
def test_tree_scripts_only_re_export_the_package(folder, package):
    import importlib.util
    for path in sorted(glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, os.path.join(REPO, folder))[:-3].replace(os.sep, ".")
        target = importlib.import_module(f"{package}.{rel}")
        spec = importlib.util.spec_from_file_location(f"_tree_{folder}_{rel}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        public = {k for k in vars(target) if not k.startswith("__")}
        assert public <= set(vars(mod)), (path, sorted(public - set(vars(mod)))[:5])
        assert all(getattr(mod, k) is getattr(target, k) for k in public), path
        body = [n for n in ast.parse(open(path).read()).body if not isinstance(n, ast.Expr)]
        assert len(body) <= 5, f"{path} holds code of its own; it belongs in {package}"


def documented_commands() -> tuple[set[str], set[str]]:
    """(modules of every `python -m idattn...` and files of every `python <folder>/<file>.py` in the README, the
    docs and the package's docstrings)."""
    import re
    texts = [open(p).read() for p in [os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md")),
                                      *_package_files()]]
    modules, files = set(), set()
    for text in texts:
        modules |= {m for m, placeholder in re.findall(r"python -m (idattn(?:\.\w+)*)(\.<)?", text) if not placeholder}
        files |= set(re.findall(r"python ((?:experiments|launch|scripts)/[\w/]+\.py)", text))
    modules.discard("idattn")
    return modules | {f"idattn.launch.{n}" for n in ("local", "slurm", "tpu")}, files  # `idattn.launch.<name>`


def test_every_documented_command_exists_and_is_a_command():
    """Each `python -m idattn.X` the docs name resolves to a module with an entry (a `__main__` guard, or a package
    with `__main__.py`), and each `python <folder>/<file>.py` exists; the slow wheel test runs their --help."""
    import importlib.util
    modules, files = documented_commands()
    assert {"idattn.train", "idattn.eval", "idattn.quickstart", "idattn.repro", "idattn.bench"} <= modules, modules
    bad = []
    for m in sorted(modules):
        spec = importlib.util.find_spec(m)
        if spec is None:
            bad.append(f"{m}: no such module")
            continue
        path = spec.origin
        if spec.submodule_search_locations:  # a package runs its __main__.py
            path = os.path.join(list(spec.submodule_search_locations)[0], "__main__.py")
        if not os.path.exists(path) or not any(_is_main_guard(n) for n in ast.parse(open(path).read()).body):
            bad.append(f"{m}: {path} has no `if __name__ == \"__main__\":` entry")
    bad += [f"{f}: missing" for f in sorted(files) if not os.path.exists(os.path.join(REPO, f))]
    assert not bad, bad


@pytest.mark.slow
def test_wheel_install_runs_the_documented_commands_from_anywhere(tmp_path):
    clone, venv, elsewhere = tmp_path / "clone", tmp_path / "venv", tmp_path / "elsewhere"
    subprocess.run(["git", "clone", "--quiet", REPO, str(clone)], check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    # The wheel alone goes into the new environment; its dependencies are this environment's, seen through a .pth
    # (its editable idattn is not: a .pth's folders are not scanned for .pth files). What the dependencies resolve
    # to is the README's install commands' test (CI runs them from scratch); this one is about what the wheel
    # holds, and downloading jax, libtpu and the rest again cost minutes of CI.
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = {p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)}
    with open(os.path.join(purelib, "idattn-test-deps.pth"), "w") as f:
        f.write("\n".join(sorted(ours)) + "\n")
    inst = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(clone)], capture_output=True,
                          text=True, timeout=1800)
    assert inst.returncode == 0, inst.stderr[-3000:]
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert not [ln for ln in check.stdout.splitlines() if ln.lower().startswith("idattn ")], check.stdout
    site = subprocess.run([py, "-c", "import idattn, os; print(os.path.dirname(idattn.__file__))"],
                          capture_output=True, text=True, cwd=str(tmp_path), check=True).stdout.strip()
    assert "site-packages" in site and not site.startswith(str(clone)), site  # not editable
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1", IDATTN_CACHE=str(tmp_path / "cache"))

    def run(*args, timeout=900, ok=(0,)):
        p = subprocess.run([py, "-m", *args], cwd=str(elsewhere), env=env, capture_output=True, text=True,
                           timeout=timeout)
        assert p.returncode in ok, f"{args}: rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        return p.stdout

    tiny = ["--config.data.tokenizer=train:512", "--config.model.vocab_size=512", "--config.model.dtype=float32",
            "--config.data.seq_len=32", "--config.train.batch_size=8", "--config.train.num_steps=2",
            "--config.train.warmup_steps=1", "--config.train.eval_batches=1", "--config.data.prefetch=0"]
    out = run("idattn.train", "--config=experiments/scaling.py:softmax,tiny", "--workdir=run", *tiny)
    assert "validation step 2" in out
    # 2 steps cannot pass the quickstart's quality gate (exit 1 with FAIL); what matters here is that it runs
    out = run("idattn.quickstart", "--workdir=qs", "--steps=2", "--mixers=softmax", "--fresh", ok=(0, 1))
    assert "| Softmax | 688,768 |" in out and os.path.exists(elsewhere / "qs" / "quickstart.png")
    out = run("idattn.repro", "ppl", "--toy", "--root=repro", "--only=interdomain", "--train_dt=paper")
    assert os.path.exists(elsewhere / "repro" / "ppl-toy.md")
    out = run("idattn.bench", "op", "--shapes=2,8,4", "--seqs=32", "--tokens=64", "--impls=chunked",
              "--modes=fwd", "--dtype=float32", "--chunk=16", "--repeats=1", "--warmup=1")
    assert "chunked" in out
    out = run("idattn.aot", "--config=experiments/scaling.py:interdomain,tiny", "--topology=v5p-8",
              "--config.mesh.fsdp=4", "--config.model.num_layers=1", "--steps=decode")
    assert "fits" in out.strip().splitlines()[-1]
    # every documented command starts from the wheel (its --help: flags parsed, library imported)
    modules, _ = documented_commands()
    failed = []
    for m in sorted(modules - {"idattn.eval.lm_eval_adapter"}):  # the harness adapter needs the [harness] extra
        p = subprocess.run([py, "-m", m, "--help"], cwd=str(elsewhere), env=env, capture_output=True, text=True,
                           timeout=300)
        text = p.stdout + p.stderr
        absl_help = p.returncode == 1 and "Try --helpfull" in text  # absl prints its help and exits 1
        if not (p.returncode == 0 or absl_help) or "Traceback" in text or len(text) < 40:
            failed.append(f"{m} --help: rc={p.returncode} {(p.stdout + p.stderr)[-500:]}")
    assert not failed, "\n".join(failed)
