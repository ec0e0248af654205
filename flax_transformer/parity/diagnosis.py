"""Why does the first diverging module diverge? Its weights and hyperparameters, judged.

The diverging torch module's parameters (and floating buffers) are paired with the Flax params
under the paired Flax path and compared after the conversion rule (a Dense `kernel` (in, out)
is the torch `weight` (out, in) transposed, reshaped when the Flax kernel splits heads, e.g.
(E, H, D)). Hyperparameters visible on both sides (torch `eps` vs Flax `epsilon`, ...) are
compared on the module and the modules inside it. The verdict, first that applies:

- "weight transposed": a Flax weight equals its torch twin without the transpose (or with one
  the rule does not make);
- "weights swapped": a Flax weight equals another torch weight of the same parent module
  (e.g. query and key exchanged);
- "weights differ": a weight differs otherwise;
- "hyperparameter differs": the weights agree, a hyperparameter does not (e.g. LayerNorm eps);
- "math differs (weights equal)": weights and visible hyperparameters agree (or there are
  none): the computation itself differs (an activation, a formula, a table).
Everything before the diverging module agrees, so its inputs are the same on both sides.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from flax_transformer.parity.module_capture import ROOT
from flax_transformer.spec.naming import LEAF_TO_TORCH, flatten_params, module_name
from flax_transformer.spec.numerics import error_stats

WEIGHT_TRANSPOSED = "weight transposed"
WEIGHTS_SWAPPED = "weights swapped"
WEIGHTS_DIFFER = "weights differ"
HYPERPARAMETER_DIFFERS = "hyperparameter differs"
MATH_DIFFERS = "math differs (weights equal)"

EQUAL, DIFFERS, TRANSPOSED, SWAPPED = "equal", "differs", "transposed", "swapped"
TORCH_ONLY, FLAX_ONLY = "torch only", "flax only"

# torch attribute -> Flax field names that mean the same thing
HYPERPARAMETERS = {
    "eps": ("epsilon", "eps", "layer_norm_eps", "layer_norm_epsilon", "variance_epsilon"),
    "approximate": ("approximate",),
    "negative_slope": ("negative_slope",),
    "num_heads": ("num_heads", "nhead", "num_attention_heads"),
    "head_dim": ("head_dim",),
    "normalized_shape": ("normalized_shape",),
}


@dataclasses.dataclass(frozen=True)
class WeightComparison:
    """One weight of the diverging module, torch side against Flax side after the conversion
    rule: its status (equal, differs, transposed, swapped, on one side only) and errors."""

    torch_name: str | None  # relative to the diverging torch module
    flax_name: str | None  # relative to the paired Flax path, '/'-joined
    status: str  # EQUAL | DIFFERS | TRANSPOSED | SWAPPED | TORCH_ONLY | FLAX_ONLY
    max_abs: float | None = None
    rel: float | None = None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class HyperparameterComparison:
    """One hyperparameter seen on both sides (torch `eps` vs Flax `epsilon`, ...) with both
    values."""

    torch_name: str  # "module.attr"
    flax_name: str  # "path/field"
    torch_value: Any
    flax_value: Any

    @property
    def equal(self) -> bool:
        """Whether the two values agree: numbers within relative 1e-12, anything else compared as
        plain values (tuples and lists alike)."""
        if isinstance(self.torch_value, (int, float)) and isinstance(self.flax_value, (int, float)):
            return bool(np.isclose(self.torch_value, self.flax_value, rtol=1e-12, atol=0))
        return _plain(self.torch_value) == _plain(self.flax_value)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Why the first diverging module diverges: the verdict (see the module docstring), its
    detail and every weight and hyperparameter compared."""

    torch_module: str
    flax_module: str
    verdict: str
    detail: str
    weights: tuple[WeightComparison, ...]
    hyperparameters: tuple[HyperparameterComparison, ...]
    # torch tensors computed between the last agreeing one and the divergence that had no
    # Flax counterpart (e.g. an activation module): the divergence may have started there.
    unverified: tuple[str, ...] = ()

    def format_lines(self) -> list[str]:
        """The diagnosis as report lines: the verdict, then one indented line per weight and
        hyperparameter."""
        lines = [
            f"weights of {self.torch_module} (torch) vs {self.flax_module} (flax): "
            f"{self.verdict}" + (f": {self.detail}" if self.detail else "")
        ]
        if self.unverified:
            lines.append(
                "  not compared (no Flax counterpart) since the last agreeing tensor: "
                + ", ".join(self.unverified)
            )
        for w in self.weights:
            err = "" if w.rel is None else f"  max abs {w.max_abs:.3e}  rel {w.rel:.3e}"
            note = f"  ({w.note})" if w.note else ""
            lines.append(f"  {w.torch_name or '-'} <-> {w.flax_name or '-'}: {w.status}{err}{note}")
        for h in self.hyperparameters:
            mark = "equal" if h.equal else "DIFFERS"
            lines.append(
                f"  {h.torch_name} = {h.torch_value!r} <-> {h.flax_name} = {h.flax_value!r}: {mark}"
            )
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as JSON-ready values (the `diagnosis` entry of the report's JSON)."""
        return {
            "torch_module": self.torch_module,
            "flax_module": self.flax_module,
            "verdict": self.verdict,
            "detail": self.detail,
            "unverified": list(self.unverified),
            "weights": [dataclasses.asdict(w) for w in self.weights],
            "hyperparameters": [
                {
                    "torch": h.torch_name,
                    "flax": h.flax_name,
                    "torch_value": _plain(h.torch_value),
                    "flax_value": _plain(h.flax_value),
                    "equal": h.equal,
                }
                for h in self.hyperparameters
            ],
        }


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


# ----------------------------------------------------------------------------- weights
def torch_weights(torch_model, module: str) -> dict[str, np.ndarray]:
    """{relative name: float64 array}: parameters and floating buffers of `module`."""
    sub = torch_model.get_submodule("" if module == ROOT else module)
    named = list(sub.named_parameters()) + [
        (k, b) for k, b in sub.named_buffers() if b.is_floating_point()
    ]
    return {k: v.detach().cpu().double().numpy() for k, v in named}


def flax_weights(variables: Mapping[str, Any], module: str) -> dict[str, np.ndarray]:
    """{relative '/'-path: array} of the params under the Flax `module` path."""
    node = variables.get("params", {})
    for part in [] if module == ROOT else module.split("/"):
        node = node.get(part, {}) if isinstance(node, Mapping) else {}
    if not isinstance(node, Mapping):
        return {}
    return {"/".join(p): np.asarray(v, np.float64) for p, v in flatten_params(node).items()}


def _join(parent: str, child: str, sep: str) -> str:
    if parent == ROOT:
        return child or ROOT
    return f"{parent}{sep}{child}" if child else parent


def _torch_key_of(flax_rel: str, flax_module: str, torch_module: str, modules_back) -> list[str]:
    """Torch names (relative to torch_module) a Flax param (relative to flax_module) may have."""
    parts = flax_rel.split("/")
    leaf = LEAF_TO_TORCH.get(parts[-1], parts[-1])
    keys = []
    full = _join(flax_module, "/".join(parts[:-1]), "/")
    torch_full = modules_back.get(full)
    if torch_full is not None:
        if torch_full == torch_module:
            keys.append(leaf)
        elif torch_module == ROOT or torch_full.startswith(torch_module + "."):
            prefix = torch_full if torch_module == ROOT else torch_full[len(torch_module) + 1 :]
            keys.append(f"{prefix}.{leaf}")
    prefix = module_name(tuple(parts[:-1]))
    generic = ".".join(re.sub(r"^(.+)_(\d+)$", r"\1.\2", p) for p in parts[:-1])
    keys += [f"{p}.{leaf}" if p else leaf for p in (prefix, generic)]
    return list(dict.fromkeys(keys))


def to_flax_layout(torch_array: np.ndarray, flax_leaf: str, shape: tuple[int, ...]):
    """The torch weight in the Flax layout the conversion rule gives (None: no such layout)."""
    array = torch_array.T if flax_leaf == "kernel" and torch_array.ndim == 2 else torch_array
    if array.shape != shape and array.size == int(np.prod(shape)):
        array = array.reshape(shape)
    return array if array.shape == shape else None


def _without_rule(torch_array: np.ndarray, flax_leaf: str, shape: tuple[int, ...]):
    """The torch weight with the opposite transpose to the rule's (a transposed-weight bug)."""
    array = torch_array if flax_leaf == "kernel" else torch_array.T
    if array.shape != shape and array.size == int(np.prod(shape)):
        array = array.reshape(shape)
    return array if array.shape == shape else None


def _close(a, b, tol) -> tuple[bool, float, float]:
    max_abs, rel = error_stats(a, b)
    return rel <= tol, max_abs, rel


def compare_weights_of(
    torch_model,
    variables: Mapping[str, Any],
    torch_module: str,
    flax_module: str,
    module_pairs: Mapping[str, str],
    tol: float,
) -> list[WeightComparison]:
    """Pair and compare the weights of one torch module and its Flax twin."""
    torch_w = torch_weights(torch_model, torch_module)
    flax_w = flax_weights(variables, flax_module)
    back = {f: t for t, f in module_pairs.items()}
    # A swap is looked for among the weights of the parent module (query vs key, ...).
    parent = ROOT if torch_module == ROOT else (torch_module.rpartition(".")[0] or ROOT)
    siblings = {_join(parent, k, "."): v for k, v in torch_weights(torch_model, parent).items()}
    results, used = [], set()
    pending = []
    for flax_rel, array in flax_w.items():
        match = next(
            (k for k in _torch_key_of(flax_rel, flax_module, torch_module, back) if k in torch_w),
            None,
        )
        if match is None or match in used:
            pending.append(flax_rel)
            continue
        used.add(match)
        results.append(_judge(match, flax_rel, torch_w[match], array, torch_module, siblings, tol))
    rest = [k for k in torch_w if k not in used]
    packed = _pair_packed(torch_w, flax_w, rest, pending)
    for chunk_name, _ in packed:  # every chunk is a swap candidate
        siblings[_join(torch_module, chunk_name, ".")] = torch_w[chunk_name]
    for chunk_name, flax_rel in packed:
        results.append(
            _judge(
                chunk_name,
                flax_rel,
                torch_w[chunk_name],
                flax_w[flax_rel],
                torch_module,
                siblings,
                tol,
            )
        )
    # Whatever the names did not pair: in order, by size and kind.
    for flax_rel in pending:
        array = flax_w[flax_rel]
        match = next(
            (k for k in rest if torch_w[k].size == array.size and _same_kind(k, flax_rel)), None
        )
        if match is None:
            results.append(WeightComparison(None, flax_rel, FLAX_ONLY))
            continue
        rest.remove(match)
        judged = _judge(match, flax_rel, torch_w[match], array, torch_module, siblings, tol)
        results.append(dataclasses.replace(judged, note=_and(judged.note, "paired by size")))
    results += [WeightComparison(k, None, TORCH_ONLY) for k in rest]
    return results


def _pair_packed(torch_w, flax_w, rest: list[str], pending: list[str]) -> list[tuple[str, str]]:
    """[(chunk name, flax param)] for torch weights holding several Flax weights stacked on axis
    0 (nn.MultiheadAttention's in_proj_weight = query, key, value). A chunk pairs with a Flax
    weight of its size and kind, query/key/value-named ones first in that order, then in tree
    order. The chunks are added to `torch_w` ("in_proj_weight[0:8]"); what pairs leaves
    `rest` and `pending`."""
    pairs = []
    for name in list(rest):
        array = torch_w[name]
        for chunks in range(2, 5):
            if array.shape[0] % chunks:
                continue
            size = array.size // chunks
            takers = [f for f in pending if flax_w[f].size == size and _same_kind(name, f)]
            takers = sorted(takers, key=_qkv_rank)[:chunks]  # stable: others keep their order
            if len(takers) < chunks:
                continue
            rest.remove(name)
            step = array.shape[0] // chunks
            for c, flax_rel in enumerate(takers):
                chunk_name = f"{name}[{c * step}:{(c + 1) * step}]"
                torch_w[chunk_name] = array[c * step : (c + 1) * step]
                pending.remove(flax_rel)
                pairs.append((chunk_name, flax_rel))
            break
    return pairs


def _qkv_rank(flax_rel: str) -> int:
    """0/1/2 for a query/key/value weight (query, q, q_proj, to_q, ...), 3 for others."""
    parent = flax_rel.split("/")[-2] if "/" in flax_rel else ""
    for rank, names in enumerate((("query", "q"), ("key", "k"), ("value", "v"))):
        if parent in names or any(parent in (f"{n}_proj", f"to_{n}") for n in names):
            return rank
    return 3


def _same_kind(torch_name: str, flax_rel: str) -> bool:
    """A bias pairs with a bias, a weight with a weight (unknown leaf names with anything)."""
    leaf = LEAF_TO_TORCH.get(flax_rel.split("/")[-1])
    return leaf is None or torch_name.rsplit(".", 1)[-1].endswith(leaf)


def _and(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _judge(torch_rel, flax_rel, torch_array, flax_array, torch_module, siblings, tol):
    leaf = flax_rel.split("/")[-1]
    shape = flax_array.shape
    expected = to_flax_layout(torch_array, leaf, shape)
    if expected is None:
        note = f"shapes {torch_array.shape} (torch) and {shape} (flax) do not convert"
        return WeightComparison(torch_rel, flax_rel, DIFFERS, note=note)
    ok, max_abs, rel = _close(flax_array, expected, tol)
    if ok:
        return WeightComparison(torch_rel, flax_rel, EQUAL, max_abs, rel)
    flipped = _without_rule(torch_array, leaf, shape)
    if flipped is not None and _close(flax_array, flipped, tol)[0]:
        note = "the Flax weight is the torch weight " + (
            "without the transpose" if leaf == "kernel" else "transposed"
        )
        return WeightComparison(torch_rel, flax_rel, TRANSPOSED, max_abs, rel, note)
    own = _join(torch_module, torch_rel, ".")
    for other, other_array in siblings.items():
        candidate = to_flax_layout(other_array, leaf, shape)
        if other != own and candidate is not None and _close(flax_array, candidate, tol)[0]:
            note = f"the Flax weight equals torch {other}"
            return WeightComparison(torch_rel, flax_rel, SWAPPED, max_abs, rel, note)
    return WeightComparison(torch_rel, flax_rel, DIFFERS, max_abs, rel)


# ----------------------------------------------------------------------------- hyperparameters
def compare_hyperparameters(
    torch_model, flax_modules: Mapping[str, Any], torch_module: str, module_pairs
) -> list[HyperparameterComparison]:
    """Hyperparameters both sides expose, on the module and every paired module inside it."""
    sub = torch_model.get_submodule("" if torch_module == ROOT else torch_module)
    out = []
    for rel, torch_sub in sub.named_modules():
        name = _join(torch_module, rel, ".")
        flax_sub = flax_modules.get(module_pairs.get(name, ""))
        if flax_sub is None:
            continue
        for attr, synonyms in HYPERPARAMETERS.items():
            torch_value = getattr(torch_sub, attr, None)
            if not _is_plain(torch_value):
                continue
            field = next((s for s in synonyms if _is_plain(getattr(flax_sub, s, None))), None)
            if field is not None:
                out.append(
                    HyperparameterComparison(
                        f"{name}.{attr}",
                        f"{module_pairs[name]}/{field}",
                        torch_value,
                        getattr(flax_sub, field),
                    )
                )
    return out


def _is_plain(value) -> bool:
    if isinstance(value, tuple):
        return all(isinstance(v, int) for v in value)
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


# ----------------------------------------------------------------------------- verdict
def diagnose(
    torch_model,
    variables: Mapping[str, Any],
    flax_modules: Mapping[str, Any],
    torch_module: str,
    flax_module: str,
    module_pairs: Mapping[str, str],
    tol: float,
) -> Diagnosis:
    """Judge the first diverging module pair (`torch_module` <-> `flax_module`): compare its
    weights (within relative `tol`) and hyperparameters and return the first verdict that
    applies."""
    weights = compare_weights_of(
        torch_model, variables, torch_module, flax_module, module_pairs, tol
    )
    hypers = compare_hyperparameters(torch_model, flax_modules, torch_module, module_pairs)
    by_status = {s: [w for w in weights if w.status == s] for s in (TRANSPOSED, SWAPPED, DIFFERS)}
    differing_hypers = [h for h in hypers if not h.equal]
    if by_status[TRANSPOSED]:
        verdict, detail = WEIGHT_TRANSPOSED, _names(by_status[TRANSPOSED])
    elif by_status[SWAPPED]:
        verdict = WEIGHTS_SWAPPED
        detail = "; ".join(f"{w.flax_name}: {w.note}" for w in by_status[SWAPPED])
    elif by_status[DIFFERS]:
        verdict, detail = WEIGHTS_DIFFER, _names(by_status[DIFFERS])
    elif differing_hypers:
        verdict = HYPERPARAMETER_DIFFERS
        detail = "; ".join(
            f"{h.torch_name} = {h.torch_value!r} vs {h.flax_name} = {h.flax_value!r}"
            for h in differing_hypers
        )
    else:
        verdict = MATH_DIFFERS
        one_sided = [w for w in weights if w.status in (TORCH_ONLY, FLAX_ONLY)]
        if not weights:
            detail = "the module has no weights on either side"
        elif one_sided:
            detail = "weights without a counterpart: " + ", ".join(
                f"{w.torch_name or w.flax_name} ({w.status})" for w in one_sided
            )
        else:
            detail = f"all {len(weights)} weights equal"
    return Diagnosis(torch_module, flax_module, verdict, detail, tuple(weights), tuple(hypers))


def _names(weights) -> str:
    return ", ".join(f"{w.torch_name} <-> {w.flax_name}" for w in weights)
