"""Weight files get the mode the umask gives any other file: safetensors 0.8 writes through a
temporary file of mode 0600 whatever the umask, so without the fix another user or a container
could not read an exported model."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from flax_transformer import preset
from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.files.modes import current_umask, umask_mode


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_umask_is_read_without_changing_it(umask_022):
    assert current_umask() == 0o022 and umask_mode() == 0o644
    os.umask(0o077)
    assert current_umask() == 0o077 and umask_mode() == 0o600


def test_convert_writes_weights_with_the_umask_mode(umask_022, tmp_path):
    from flax_transformer.interop.convert import save_torch_state

    save_torch_state(tmp_path / "w.safetensors", {"a": np.zeros(3, np.float32)}, preset("tiny"))
    atomic_write_text(tmp_path / "beside.txt", "x")
    assert mode(tmp_path / "w.safetensors") == mode(tmp_path / "beside.txt") == 0o644


def test_hf_save_writes_weights_with_the_umask_mode(umask_022, tmp_path):
    from flax_transformer.hf.checkpoint import write_hf_dir

    write_hf_dir(tmp_path / "hf", {"model_type": "marian"}, {"a": np.zeros(3, np.float32)}, {})
    assert mode(tmp_path / "hf" / "model.safetensors") == mode(tmp_path / "hf" / "config.json")
    assert mode(tmp_path / "hf" / "model.safetensors") == 0o644
