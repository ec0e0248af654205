"""Which torch tensor is compared with which Flax tensor.

Modules are paired first, then the tensors inside each module pair:
1. `mapping` (the user's): a dict {regex: replacement} from torch module names to Flax module
   paths ('/'-separated; the first regex that fully matches wins, groups as in re.sub), or a
   callable torch_name -> flax_path | None. `path#k` pairs the torch module's calls with the
   Flax module's calls from the k-th on (two torch modules, one Flax module run twice).
2. the canonical rule for modules the mapping left: a Flax path names the torch module that
   spec.naming.module_name gives it (`encoder/layers_0/ffn` <-> `encoder.layers.0.ffn`), and
   more generally `name_3` <-> `name.3` (linen lists <-> torch ModuleList).
3. an automatic fallback for every tensor still unpaired (`auto=True`): the two sequences,
   each in execution order, are aligned between the pairs already found (dynamic programming:
   first the most pairs whose values agree, then between those the most pairs of equal
   shape). Such pairs are marked `auto` in the report. A dict mapping's `None` value
   (`{"lm_head": None}`), or a callable's EXCLUDE, keeps a torch module out of every pairing.
Inside a module pair, outputs pair by key and call ("0", "logits", ...), then the rest by order
and shape, as in 3.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from flax_transformer.parity.module_capture import ROOT, Captured
from flax_transformer.spec.naming import module_name

CANONICAL, MAPPING, AUTO = "canonical", "mapping", "auto"
MAX_ALIGNMENT_CELLS = 4_000_000  # beyond this the fallback aligns greedily

NameMapping = Mapping[str, str] | Callable[[str], str | None] | None


@dataclasses.dataclass(frozen=True)
class Pair:
    """One torch tensor and the Flax tensor compared with it, and how the pair was found:
    canonical, mapping or auto."""

    torch: Captured
    flax: Captured
    how: str  # CANONICAL | MAPPING | AUTO


@dataclasses.dataclass
class Pairing:
    """The outcome of pairing two captures: the pairs in torch execution order, what stayed
    unpaired on each side, the module pairs, and mapping targets the Flax side lacks."""

    pairs: list[Pair]  # in torch execution order
    torch_only: list[Captured]
    flax_only: list[Captured]
    modules: dict[str, str]  # torch module -> Flax module, from the pairs (first pair wins)
    problems: list[str]  # mapping targets the Flax side does not have


def canonical_torch_names(flax_module: str) -> list[str]:
    """Torch module names a Flax path mirrors: the spec's rule, then `name_N` -> `name.N`."""
    if flax_module == ROOT:
        return [ROOT]
    parts = tuple(flax_module.split("/"))
    generic = ".".join(re.sub(r"^(.+)_(\d+)$", r"\1.\2", p) for p in parts)
    return list(dict.fromkeys([module_name(parts), generic]))


class _Exclude:
    def __repr__(self) -> str:
        return "EXCLUDE"


# A mapping's answer "never pair this torch module" (a dict's None value; a callable returns it).
EXCLUDE = _Exclude()


def mapped_name(mapping: NameMapping, torch_module: str):
    """The Flax path the mapping gives, None (no opinion: the rule and fallback decide) or
    EXCLUDE."""
    if mapping is None:
        return None
    if callable(mapping):
        return mapping(torch_module)
    for pattern, replacement in mapping.items():
        match = re.fullmatch(pattern, torch_module)
        if match:
            return EXCLUDE if replacement is None else match.expand(replacement)
    return None


def split_call(target: str) -> tuple[str, int]:
    """'positions#1' -> ('positions', 1): a mapping target may start at a later call."""
    module, _, call = target.rpartition("#")
    if module and call.isdigit():
        return module, int(call)
    return target, 0


def pair_modules(
    torch_modules: Sequence[str], flax_modules: Sequence[str], mapping: NameMapping
) -> tuple[dict[str, tuple[str, str, int]], list[str]]:
    """{torch module: (flax module, how, first flax call)} by the mapping, then the canonical
    rule. A mapping may send several torch modules to one Flax module (`path#1`: from its
    second call on), e.g. two torch position modules to one Flax module called twice."""
    flax_set = set(flax_modules)
    paired: dict[str, tuple[str, str, int]] = {}
    used: set[str] = set()
    problems = []
    for name in torch_modules:
        target = mapped_name(mapping, name)
        if target is None:
            continue
        if target is EXCLUDE:
            paired[name] = (EXCLUDE, MAPPING, 0)
            continue
        module, call = split_call(target)
        if module not in flax_set:
            problems.append(f"mapping sends {name!r} to {target!r}, which produced no Flax value")
        else:
            paired[name] = (module, MAPPING, call)
            used.add(module)
    canonical: dict[str, str] = {}
    for flax_name in flax_modules:
        for torch_name in canonical_torch_names(flax_name):
            canonical.setdefault(torch_name, flax_name)
    for name in torch_modules:
        target = canonical.get(name)
        if name not in paired and target is not None and target not in used:
            paired[name] = (target, CANONICAL, 0)
            used.add(target)
    return paired, problems


def align(
    left: Sequence[Captured], right: Sequence[Captured], agree: Callable[[Captured, Captured], bool]
) -> list[tuple[int, int]]:
    """Order-preserving pairs (i, j) of equal shape, in two passes: first the most pairs whose
    values agree; then, between those, the most pairs of equal shape (after a divergence
    nothing agrees and shapes alone align the rest). Agreeing pairs first keeps a chain of
    equal values (a layer's output = its last norm's = the stack's) from shifting by one."""
    if not left or not right:
        return []
    if len(left) * len(right) > MAX_ALIGNMENT_CELLS:
        return _align_greedy(left, right)
    agreeing = _lcs(
        len(left),
        len(right),
        lambda i, j: left[i].shape == right[j].shape and agree(left[i], right[j]),
    )
    pairs = list(agreeing)
    bounds = [(-1, -1), *agreeing, (len(left), len(right))]
    for (i0, j0), (i1, j1) in zip(bounds, bounds[1:], strict=False):
        shapes_left = [v.shape for v in left[i0 + 1 : i1]]
        shapes_right = [v.shape for v in right[j0 + 1 : j1]]
        same = _lcs(
            len(shapes_left),
            len(shapes_right),
            lambda i, j, a=shapes_left, b=shapes_right: a[i] == b[j],
        )
        pairs += [(i0 + 1 + a, j0 + 1 + b) for a, b in same]
    return sorted(pairs)


def _lcs(n: int, m: int, matches: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """The longest order-preserving list of (i, j) with matches(i, j); among equally long
    ones, each i pairs with the earliest j it can (a run of equal values pairs in order)."""
    if n == 0 or m == 0:
        return []
    score = np.zeros((n + 1, m + 1), dtype=np.int64)
    hit = np.zeros((n, m), dtype=bool)
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            score[i, j] = max(score[i + 1, j], score[i, j + 1])
            if matches(i, j):
                hit[i, j] = True
                score[i, j] = max(score[i, j], score[i + 1, j + 1] + 1)
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if hit[i, j] and score[i, j] == score[i + 1, j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif score[i, j] == score[i, j + 1]:
            j += 1  # skip right items first: each left item pairs as early as it can
        else:
            i += 1
    return pairs


def _ordered_anchors(by_torch: Mapping[int, tuple[int, str]]) -> list[tuple[int, int]]:
    """The longest chain of pairs (i, j) increasing in both i and j (patience sorting)."""
    items = sorted((i, j) for i, (j, _) in by_torch.items())
    tails: list[int] = []  # tails[k]: index into items of the chain of length k+1's last pair
    previous: list[int] = [-1] * len(items)
    for index, (_, j) in enumerate(items):
        k = int(np.searchsorted([items[t][1] for t in tails], j))
        previous[index] = tails[k - 1] if k else -1
        if k == len(tails):
            tails.append(index)
        else:
            tails[k] = index
    chain, index = [], tails[-1] if tails else -1
    while index >= 0:
        chain.append(items[index])
        index = previous[index]
    return chain[::-1]


def _align_greedy(left, right) -> list[tuple[int, int]]:
    pairs, j = [], 0
    for i, item in enumerate(left):
        k = next((k for k in range(j, len(right)) if right[k].shape == item.shape), None)
        if k is not None:
            pairs.append((i, k))
            j = k + 1
    return pairs


def pair_tensors(
    torch_values: Sequence[Captured],
    flax_values: Sequence[Captured],
    *,
    mapping: NameMapping = None,
    auto: bool = True,
    agree: Callable[[Captured, Captured], bool] = lambda a, b: False,
) -> Pairing:
    """Pair the two captures (see the module docstring); `agree` breaks the fallback's ties."""
    torch_modules = list(dict.fromkeys(v.module for v in torch_values))
    flax_modules = list(dict.fromkeys(v.module for v in flax_values))
    module_pairs, problems = pair_modules(torch_modules, flax_modules, mapping)
    by_torch: dict[int, tuple[int, str]] = {}  # torch index -> (flax index, how)
    flax_taken: set[int] = set()

    flax_by_module: dict[str, list[int]] = {}
    for j, value in enumerate(flax_values):
        flax_by_module.setdefault(value.module, []).append(j)
    torch_by_module: dict[str, list[int]] = {}
    for i, value in enumerate(torch_values):
        torch_by_module.setdefault(value.module, []).append(i)

    excluded = {name for name, (target, _, _) in module_pairs.items() if target is EXCLUDE}
    module_pairs = {k: v for k, v in module_pairs.items() if k not in excluded}
    for torch_module, (flax_module, how, first_call) in module_pairs.items():
        left = torch_by_module[torch_module]
        right = [j for j in flax_by_module[flax_module] if j not in flax_taken]
        keyed = {(flax_values[j].key, flax_values[j].call): j for j in right}
        rest_left = []
        for i in left:
            j = keyed.pop((torch_values[i].key, torch_values[i].call + first_call), None)
            if j is not None and torch_values[i].shape == flax_values[j].shape:
                by_torch[i] = (j, how)
                flax_taken.add(j)
            else:
                rest_left.append(i)
        rest_right = [j for j in right if j not in flax_taken and not flax_values[j].sown]
        for a, b in align(
            [torch_values[i] for i in rest_left], [flax_values[j] for j in rest_right], agree
        ):
            by_torch[rest_left[a]] = (rest_right[b], how)
            flax_taken.add(rest_right[b])

    if auto:
        # Align between anchors (the pairs found so far that keep both orders), so a fallback
        # pair never crosses a named one.
        bounds = [(-1, -1), *_ordered_anchors(by_torch), (len(torch_values), len(flax_values))]
        for (i0, j0), (i1, j1) in zip(bounds, bounds[1:], strict=False):
            left = [
                i
                for i in range(i0 + 1, i1)
                if i not in by_torch and torch_values[i].module not in excluded
            ]
            right = [j for j in range(j0 + 1, j1) if j not in flax_taken]
            lv, rv = [torch_values[i] for i in left], [flax_values[j] for j in right]
            for a, b in align(lv, rv, agree):
                by_torch[left[a]] = (right[b], AUTO)
                flax_taken.add(right[b])

    pairs, modules = [], {}
    for i, value in enumerate(torch_values):
        if i in by_torch:
            j, how = by_torch[i]
            pairs.append(Pair(value, flax_values[j], how))
            modules.setdefault(value.module, flax_values[j].module)
    torch_only = [v for i, v in enumerate(torch_values) if i not in by_torch]
    flax_only = [v for j, v in enumerate(flax_values) if j not in flax_taken]
    return Pairing(pairs, torch_only, flax_only, modules, problems)
