"""Parity tests run in float64 where they ask for it and with matmul precision pinned.

x64 is switched on for the parity_tests package only (package-scoped fixture), so the rest of the
suite keeps JAX's default 32-bit behaviour, the one users get.
"""

import jax
import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def float64_and_highest_precision():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    with jax.enable_x64(True), jax.default_matmul_precision("highest"):
        yield
    torch.set_float32_matmul_precision(previous)
