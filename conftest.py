"""Settings for the whole test session (tests/ and parity_tests/), applied before JAX starts.

The suite's time goes to XLA compiling many small programs, not to running them. XLA:CPU's
cheapest code generation halves compile time (measured: the decoding tests 142 s -> 87 s of
CPU). It changes how fast the code runs, not what it computes: no fast-math, so results differ
at most by the rounding of a different instruction order, far inside every tolerance here; and
runs that must be bit-identical (resume) are compared under the same flags. Subprocesses the
tests start (train.py runs, fake-device meshes) inherit the flags through the environment.
"""

import os

import pytest

FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *FAST_COMPILE]).strip()


@pytest.fixture(autouse=True, scope="session")
def float32_products_in_float32():
    """On a GPU, XLA multiplies float32 matrices in TF32 unless told otherwise (about 1e-3
    relative); the suite's float32 tolerances (~1e-5) are for float32 products, so on any
    backend but the CPU the session pins matmul precision to "highest", as the parity runs do
    (docs/architecture.md, "Matmul precision"). On the CPU products are float32 already."""
    import jax

    if jax.default_backend() != "cpu":
        jax.config.update("jax_default_matmul_precision", "highest")
    yield


@pytest.fixture(scope="session")
def llms(tmp_path_factory):
    """The tiny Llama-lineage models of tests/hf_llms.py, each built and trained by
    transformers on first use and saved once per session: {cell: (torch model, directory)}."""
    from tests.hf_llms import Models

    return Models(tmp_path_factory)


def pytest_report_header(config):
    """Which native kernels the session can run (their tests skip where one is not built: `ftx
    kernels build`), read without JAX and without loading them."""
    from flax_transformer.kernels import cache, cpu
    from flax_transformer.kernels.libraries import LIBRARIES

    states = []
    for name, lib in LIBRARIES.items():
        lacking = cpu.platform_problem() or cpu.missing_flags(lib.cpu)
        states.append(f"{name} {'(not for this CPU)' if lacking else cache.check(lib).state}")
    return f"native kernels in {cache.kernel_dir()}: {', '.join(states)}"
