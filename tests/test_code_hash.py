"""The training hashes (idattn.studies.code_hash, scheme v2) see code, not its imports or prose: moving an import
between a function and the module's top, or editing a comment, a docstring or the command block, trains nothing
again, while a change of code does; runs stamped under the raw-bytes scheme v1 are read through V1_TO_V2, whose
keys are the v1 hashes of the files as committed at V1_TO_V2_COMMIT."""
import glob
import os
import shutil
import subprocess

import pytest

from idattn.studies import code_hash, runcache as cache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP = '''"""The step."""
from __future__ import annotations

import math


def loss(x):
    """The loss."""
    import numpy as np  # local

    return float(np.log(x)) + math.pi
'''


def _write(pkg, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (pkg / os.path.dirname(rel)).mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)


def test_v2_sees_code_but_not_imports_prose_or_the_command_block(tmp_path, monkeypatch):
    pkg = tmp_path / "idattn"
    rel, other = os.path.join("train", "step.py"), os.path.join("data", "tokenizer.py")
    files = (rel, other)
    _write(pkg, {rel: STEP, other: "def encode(t):\n    return list(t)\n"})
    monkeypatch.setattr(code_hash, "PACKAGE", str(pkg))

    def v(scheme="v2"):
        return code_hash._files_hash(files, scheme=scheme)

    base, base_v1 = v(), v("v1")
    moved_up = STEP.replace("import math\n", "import math\n\nimport numpy as np\n").replace(
        "    import numpy as np  # local\n\n", "")
    same = [
        moved_up,  # the local import at the module's top
        STEP.replace("import math\n", "").replace("    import numpy as np", "    import math\n    import numpy as np"),
        STEP.replace("(x):\n", "(x):  # why\n").replace('"""The loss."""', '"""The loss,\n    reworded."""'),
        STEP.replace("from __future__ import annotations\n", "from __future__ import (\n    annotations,\n)\n"),
        STEP + '\n\nif __name__ == "__main__":\n    from idattn.data.prepare import main\n    raise SystemExit(main())\n',
    ]
    for text in same:
        (pkg / rel).write_text(text)
        assert v() == base, text
        assert v("v1") != base_v1  # the raw bytes did change
    for text in (STEP.replace("math.pi", "math.e"), STEP + "\nEPS = 1e-6\n",
                 STEP.replace("    return", "    x = x + 0\n    return")):
        (pkg / rel).write_text(text)
        assert v() != base, text
    (pkg / rel).write_text(STEP)
    assert v() == base
    (pkg / other).write_text("def encode(t):\n    return list(t)[::-1]\n")  # every listed file counts
    assert v() != base


def test_a_run_stamped_with_a_migrated_v1_hash_is_reused_and_no_other(tmp_path, monkeypatch):
    v1, v2 = next(iter(code_hash.V1_TO_V2.items()))
    wd = str(tmp_path / "run")
    cache.write_marker(wd, {"status": "done", "src": "m1", "train_src": v1})
    rec = cache.check_reuse(wd, "m1", False, train_src=v2)
    assert rec["status"] == "done" and os.path.isdir(wd) and not glob.glob(wd + ".stale-*")
    assert cache.check_reuse(wd, "m1", False, train_src="0123456789") == {}  # other code: trained again
    assert not os.path.exists(wd) and glob.glob(wd + ".stale-*")
    other_v1 = "f" * 10  # a v1 hash the table does not hold (code the migration never saw)
    assert other_v1 not in code_hash.V1_TO_V2
    cache.write_marker(wd, {"status": "done", "src": "m1", "train_src": other_v1})
    assert cache.check_reuse(wd, "m1", False, train_src=v2) == {} and not os.path.exists(wd)
    # the quickstart's record carries "<model hash>-<training hash>"
    from idattn.studies.quickstart import claim_run, write_run_marker
    qwd = str(tmp_path / "softmax")
    write_run_marker(qwd, {"code": f"a1-{v1}", "config": "c3", "finished": True, "train_s": 3.0})
    assert claim_run(qwd, {"code": f"a1-{v2}", "config": "c3"}, log=lambda s: None)["train_s"] == 3.0
    write_run_marker(qwd, {"code": f"a1-{other_v1}", "config": "c3", "finished": True, "train_s": 3.0})
    assert claim_run(qwd, {"code": f"a1-{v2}", "config": "c3"}, log=lambda s: None) == {}


def test_the_migration_table_is_that_of_the_files_at_its_commit(tmp_path, monkeypatch):
    commit = code_hash.V1_TO_V2_COMMIT
    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")):
        pytest.skip("no git checkout to read the migration commit from")
    if subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True).returncode:
        pytest.skip(f"commit {commit[:12]} is not in this clone (shallow?)")
    pkg = tmp_path / "idattn"
    for rel in set(code_hash.TRAIN_FILES + code_hash.SYNTHETIC_TRAIN_FILES):
        (pkg / os.path.dirname(rel)).mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_bytes(subprocess.run(["git", "-C", REPO, "show", f"{commit}:idattn/{rel}"],
                                               capture_output=True, check=True).stdout)
    monkeypatch.setattr(code_hash, "PACKAGE", str(pkg))
    table = {code_hash._files_hash(files, scheme="v1"): code_hash._files_hash(files)
             for files in (code_hash.TRAIN_FILES, code_hash.SYNTHETIC_TRAIN_FILES)}
    assert table == code_hash.V1_TO_V2
