"""Every public name says what it is: each module of flax_transformer/ and torch_reference/ has a
module docstring, and so does each public module-level function and class and each public method
of a public class (public = the name does not start with `_`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flax_transformer", "torch_reference")

# Framework hooks whose contract is the framework's, not ours: linen calls `setup` to build the
# submodules, and the submodules' own docstrings say what they are.
EXEMPT_METHODS = {"setup"}

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def source_files() -> list[str]:
    """Every .py file of the two packages, as a path relative to the repository root."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    )


def undocumented(relative: str, root: Path = ROOT) -> list[str]:
    """`file:line name` for the module and each public name in one file that has no docstring."""
    tree = ast.parse((root / relative).read_text(), filename=relative)
    missing = [] if ast.get_docstring(tree) else [f"{relative}:1 (module docstring)"]
    for node in tree.body:
        if not isinstance(node, DEFINITIONS) or node.name.startswith("_"):
            continue
        if not ast.get_docstring(node):
            missing.append(f"{relative}:{node.lineno} {node.name}")
        if isinstance(node, ast.ClassDef):
            for method in node.body:
                if (
                    isinstance(method, DEFINITIONS)
                    and not method.name.startswith("_")
                    and method.name not in EXEMPT_METHODS
                    and not ast.get_docstring(method)
                ):
                    missing.append(f"{relative}:{method.lineno} {node.name}.{method.name}")
    return missing


def test_every_public_name_has_a_docstring():
    missing = [line for f in source_files() for line in undocumented(f)]
    assert not missing, f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)


def test_the_check_sees_what_it_should(tmp_path):
    # The walker itself: a missing module docstring, function, class and method are reported;
    # private names, linen setup and nested helpers are not.
    package = tmp_path / "flax_transformer"
    package.mkdir()
    (package / "sample.py").write_text(
        "def public(): pass\n"
        "def _private(): pass\n"
        "class Thing:\n"
        '    """A thing."""\n'
        "    def method(self): pass\n"
        "    def setup(self): pass\n"
        "    def _helper(self):\n"
        "        def inner(): pass\n"
        "class _Hidden:\n"
        "    def method(self): pass\n"
    )
    assert undocumented("flax_transformer/sample.py", root=tmp_path) == [
        "flax_transformer/sample.py:1 (module docstring)",
        "flax_transformer/sample.py:1 public",
        "flax_transformer/sample.py:5 Thing.method",
    ]
