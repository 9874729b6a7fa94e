"""`all_processes_agree` (idattn.train.checkpoint) with real processes that disagree.

Two CPU processes joined by jax.distributed through the local launcher (launch/local.py, gloo collectives), as the
trainer runs them: each process votes in four rounds (both ok; only process 1 not ok; only process 0 not ok;
neither ok) and prints what the collective returned. Every process must get the AND of the votes: a checkpoint
that one process cannot read is rejected by all, so none of them restores a step the others skip.
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests import train_helpers as T

ROUNDS = [(True, True), (True, False), (False, True), (False, False)]  # (process 0's vote, process 1's)

SCRIPT = r"""
import sys
from idattn.train import distributed
assert distributed.initialize("auto")
import jax
from idattn.train.checkpoint import all_processes_agree
rounds = [(True, True), (True, False), (False, True), (False, False)]
me = jax.process_index()
assert jax.process_count() == 2, jax.process_count()
got = [all_processes_agree(votes[me]) for votes in rounds]
print(f"AGREE {me} " + " ".join(str(int(g)) for g in got), flush=True)
"""


def test_all_processes_agree_with_two_processes_that_disagree(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(SCRIPT)
    env = T.subprocess_env(IDATTN_HEARTBEAT_TIMEOUT_S="30")
    cmd = [sys.executable, os.path.join(T.REPO, "launch", "local.py"), "--num_processes=2", "--", str(script)]
    proc = subprocess.run(cmd, cwd=T.REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = sorted(line.split("AGREE ", 1)[1] for line in out.splitlines() if "AGREE " in line)
    want = " ".join(str(int(a and b)) for a, b in ROUNDS)  # 1 0 0 0
    assert lines == [f"0 {want}", f"1 {want}"], (f"process, then each round's answer: got {lines}, want every "
                                                 f"process '{want}'")
