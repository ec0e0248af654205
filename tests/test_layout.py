"""The package's architecture, checked: the import arrows point one way, and the cheap imports
stay cheap (`import flax_transformer` and `import torch_reference` load no JAX)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flax_transformer"

# Which subpackages a library module of each subpackage may import (lazy imports included).
# Commands live in cli/ only; a room's __main__.py is a thin wrapper that calls a cli main.
ALLOWED = {
    "files": {"files"},
    "spec": {"files", "spec"},
    # The native kernels (C++ sources, their build and cache, the jax.ffi bindings, the one
    # switch object): below nn/ and decoding/, which call them; they need nothing of the model.
    "kernels": {"files", "kernels"},
    "nn": {"files", "spec", "kernels", "nn"},
    "decoding": {"files", "spec", "kernels", "nn", "decoding"},
    "interop": {"files", "spec", "kernels", "nn", "interop"},
    # Everything Hugging Face: configs, weights, checkpoints, tokenizers, generation semantics.
    "hf": {"files", "spec", "kernels", "nn", "decoding", "interop", "hf"},
    # The data pipeline: tasks and corpora, tokenizers, the token cache, batching, packing. It
    # needs nn for packing's segment masks and hf for a run's Hugging Face tokenizer; it knows
    # nothing of training (the run directory names its cache folder, not the other way round).
    "data": {"files", "spec", "kernels", "nn", "hf", "data"},
    "training": {
        "files",
        "spec",
        "kernels",
        "nn",
        "decoding",
        "interop",
        "hf",
        "data",
        "training",
    },  # fmt: skip
    "parity": {"files", "spec", "kernels", "nn", "interop", "parity"},
    "export": {"files", "spec", "kernels", "nn", "decoding", "interop", "export"},
    # The command line sits above every room.
    "cli": None,
}
# The application layer: one spec and one function per workflow (train, score, export), over
# every library room; the commands call it, it never calls them.
ALLOWED["runs"] = ALLOWED["training"] | {"parity", "export", "runs"}
# Entry points sit above all rooms: a room's `__main__.py` (`python -m flax_transformer.ROOM`),
# which only hands over to a command of cli/ (test_main_wrappers_only_call_a_command).
ENTRY_POINTS = {"__main__.py"}
# Rooms within a room: what their modules may import of the package (the bottom of their room).
# hf/families/: the Hugging Face family registry that the rest of hf/ reads, never the reverse.
SUB_ROOMS = {
    "hf/families": (
        "flax_transformer.files",
        "flax_transformer.spec",
        "flax_transformer.hf.families",
    ),
}
MAX_LINES = 600
# What spec/ and torch_reference may import of the package: plain Python and numpy only.
NUMPY_ONLY = ("flax_transformer.spec", "flax_transformer.files", "flax_transformer.lazy")


def imported_modules(path: Path) -> set[str]:
    """Every flax_transformer.* module named by an import anywhere in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n.startswith("flax_transformer.")}


def library_modules():
    for path in sorted(PACKAGE.glob("*/**/*.py")):
        if not {path.name, f"{path.parent.name}/{path.name}"} & ENTRY_POINTS:
            yield path


def test_main_wrappers_only_call_a_command():
    """A room's `__main__.py` imports nothing of the package but one cli module (and lazy, for
    the moved-path shim of a command that lived there before), and defines no function."""
    for path in sorted(PACKAGE.glob("*/__main__.py")):
        tree = ast.parse(path.read_text())
        names = imported_modules(path) - {
            "flax_transformer.lazy",
            "flax_transformer.lazy.moved_module",
        }
        commands = {n for n in names if n.startswith("flax_transformer.cli.")}
        assert names == commands and commands, f"{path.relative_to(ROOT)} imports {sorted(names)}"
        defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{path.relative_to(ROOT)} defines {[n.name for n in defined]}"


def test_commands_load_a_run_one_way():
    """Every command loads a run through runs.load.open_run (directory check, x64 for a
    float64 run, the checkpoint choice, the model kinds it can use): none calls load_run or
    enable_x64_for itself, and no room below the application layer loads a run at all (the
    run directory is runs/'s: --init-from's parameters reach the loop loaded)."""
    home = PACKAGE / "runs/load.py"
    users = [*PACKAGE.glob("cli/*.py"), *PACKAGE.glob("runs/*.py")]
    offenders = []
    for path in users:
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.id] if isinstance(node, ast.Name) else []
            if isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno} {name}"
                for name in names
                if name in ("load_run", "enable_x64_for")
            ]
    assert not offenders, offenders
    below = [p for p in library_modules() if p.relative_to(PACKAGE).parts[0] not in ("cli", "runs")]
    # (runs/ is above them anyway; the old paths of runs/'s modules are shims in training/)
    old_paths = {f"flax_transformer.training.{m}" for m in ("run", "run_dir", "hf_runs")}
    loaders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in below
        for name in imported_modules(path)
        if name in old_paths or name.rsplit(".", 1)[0] in old_paths
    ]
    assert not loaders, loaders
    defined = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in PACKAGE.glob("**/*.py")
        if path != home
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in ("open_run", "load_run")
    ]
    assert not defined, f"a second way to load a run: {defined}"


def test_subpackages_import_only_downwards():
    violations = []
    for path in library_modules():
        room = path.relative_to(PACKAGE).parts[0]
        for name in imported_modules(path):
            target = name.split(".")[1]
            if target in ALLOWED and ALLOWED[room] is not None and target not in ALLOWED[room]:
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "imports against the arrows:\n" + "\n".join(violations)


# The modules at the top of the package, each placed like a room: what it may import of the
# package.
TOP_LEVEL = {
    "lazy.py": set(),  # the lazy-export and moved-path helpers every room's __init__ uses
    "__init__.py": {"lazy", "spec", "nn"},  # the public API (names only; loaded lazily)
    "nnx.py": {"spec", "nn", "interop", "data", "training"},  # the models as flax.nnx modules
    # paths of 0.1, kept one release: shims onto their new homes
    "decode.py": {"lazy", "decoding"},
    "numerics.py": {"lazy", "spec"},
    "sharding.py": {"lazy", "training"},
    # `python -m flax_transformer.X`: thin wrappers of a cli/ command (the commands live there)
    "convert.py": {"lazy", "cli"},
    "generate.py": {"cli"},
    "train.py": {"cli", "training", "files"},  # host_memory: re-exec before JAX; interruptions
    "demo.py": {"lazy", "cli"},
    "launch.py": {"lazy", "cli"},
}


def test_top_level_modules_are_placed_and_import_only_downwards():
    modules = {path.name: path for path in PACKAGE.glob("*.py")}
    unplaced, gone = sorted(set(modules) - set(TOP_LEVEL)), sorted(set(TOP_LEVEL) - set(modules))
    assert not (unplaced or gone), f"TOP_LEVEL is out of date: unplaced {unplaced}, gone {gone}"
    violations = []
    for name, path in modules.items():
        allowed = TOP_LEVEL[name]
        if allowed is None:
            continue
        for module in imported_modules(path):
            target = module.split(".")[1]
            if target != path.stem and target not in allowed:
                violations.append(f"flax_transformer/{name} imports {module}")
    assert not violations, "imports against the arrows:\n" + "\n".join(violations)


def test_sub_rooms_import_only_what_lies_below_them():
    violations = []
    for sub_room, allowed in SUB_ROOMS.items():
        paths = sorted((PACKAGE / sub_room).glob("*.py"))
        assert paths, f"{sub_room} has no modules"
        for path in paths:
            for name in imported_modules(path):
                if not name.startswith(allowed):
                    violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "imports against the arrows:\n" + "\n".join(violations)


def test_spec_and_torch_reference_need_no_jax():
    for path in [
        *PACKAGE.glob("spec/*.py"),
        *PACKAGE.glob("files/*.py"),
        *(ROOT / "torch_reference").glob("*.py"),
    ]:
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                for name in names:
                    assert name.split(".")[0] not in {"jax", "flax", "optax", "orbax"}, (
                        f"{path.relative_to(ROOT)} imports {name}"
                    )
                    if name.startswith("flax_transformer."):
                        assert name.startswith(NUMPY_ONLY), (
                            f"{path.relative_to(ROOT)} imports {name}: only {NUMPY_ONLY} are "
                            "numpy-only"
                        )


def test_files_stay_small():
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in [*PACKAGE.rglob("*.py"), *(ROOT / "torch_reference").glob("*.py")]
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"files over {MAX_LINES} lines: {too_long}"


def test_importing_the_packages_loads_no_jax():
    code = (
        "import sys, flax_transformer, torch_reference, flax_transformer.spec.config, "
        "flax_transformer.parity, flax_transformer.interop, flax_transformer.decoding, "
        "flax_transformer.hf, flax_transformer.export, flax_transformer.kernels; "
        # what every `ftx` command checks first (the kernel switches): no JAX either
        "from flax_transformer.kernels.switches import KERNELS; KERNELS.preflight(); "
        "loaded = [m for m in ('jax', 'flax', 'optax') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "package",
    [
        "flax_transformer",
        "flax_transformer.parity",
        "flax_transformer.interop",
        "flax_transformer.hf",
        "flax_transformer.export",
    ],
)
def test_every_public_name_resolves(package):
    module = __import__(package, fromlist=["__all__"])
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        module.nope  # noqa: B018


def test_no_argparse_below_the_commands():
    """Flags are parsed in cli/ only: the workflows (runs/) and the library rooms take typed
    specs and options, never an argparse Namespace (so nothing below cli/ imports argparse)."""
    offenders = []
    for path in library_modules():
        if path.relative_to(PACKAGE).parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if "argparse" in names:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
