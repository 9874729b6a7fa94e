"""docs/config.md is generated from base_config() and idattn/configs/reference.py: every key has a meaning, and
the committed file is what the generator writes today."""
from __future__ import annotations

import os

from idattn.configs import base_config, reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_key_has_a_description_and_none_is_stale():
    missing, stale = reference.missing_and_stale()
    assert not missing, f"config keys without a description in idattn/configs/reference.py: {missing}"
    assert not stale, f"descriptions of keys base_config() does not have: {stale}"
    assert len(reference.leaves(base_config())) == len(reference.DESCRIPTIONS)


def test_a_new_key_without_a_description_is_caught(monkeypatch):
    real = reference.base_config

    def with_new_key():
        c = real()
        c.train.new_knob = 1
        return c
    monkeypatch.setattr(reference, "base_config", with_new_key)
    assert reference.missing_and_stale()[0] == ["train.new_knob"]
    try:
        reference.render()
    except ValueError as e:
        assert "train.new_knob" in str(e)
    else:
        raise AssertionError("render() accepted a key without a description")


def test_docs_config_md_is_the_generated_reference():
    with open(os.path.join(REPO, "docs", "config.md")) as f:
        committed = f.read()
    assert committed == reference.render(), ("docs/config.md is stale: python -m idattn.configs.reference "
                                             "--out=docs/config.md")
    for key, value in reference.leaves(base_config()):  # each key's row shows its current default
        assert f"| `{key}` |" in committed, key
