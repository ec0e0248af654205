"""Every intermediate of one forward pass of any torch module and any Flax linen module.

Each value is a `Captured`: the module that produced it (torch: its `named_modules()` name,
Flax: its path joined with '/'; the root is `ROOT` on both sides), the key inside that module's
output (outputs that are tuples, lists, dicts, dataclasses or HF `ModelOutput`s are flattened:
`"0"`, `"logits"`, `"encoder_last_hidden_state"`; a plain tensor has key `""`), which call of
the module it came from (a module run twice gives call 0 and 1) and the array, in execution
order (a module's output comes after its children's).

- torch: a forward hook on every submodule of the model.
- Flax: `capture_intermediates=True` (every module's `__call__` output) plus the values the
  modules sow into `intermediates` (key = the sown name, e.g. `attention_weights`). The order of
  Flax values comes from a method interceptor that sees each `__call__` end; a sown value is
  placed at the first interceptor event after it was sown (before the sowing module's next
  child call, or at its own end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ROOT = "(root)"  # the display name of the model itself, on both sides
MAX_DEPTH = 6  # how deep nested outputs are flattened


@dataclasses.dataclass(frozen=True)
class Captured:
    """One intermediate tensor of a forward pass: the module that produced it, where in its
    output, which call, and the array."""

    module: str  # torch: dotted module name; Flax: '/'-joined path; ROOT for the model itself
    key: str  # where in the module's output ("" for a plain tensor), or the sown name
    call: int  # 0 for the module's first call, 1 for its second, ...
    array: np.ndarray
    sown: bool = False
    # Flax: the module call's first positional input, for transforms that need it
    # (transforms.minus_input: a module that adds to its input, e.g. positions).
    input: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """`module`, `module:key`, with `#call` for calls after the first."""
        text = self.module + (f":{self.key}" if self.key else "")
        return text + (f"#{self.call}" if self.call else "")

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self.array.shape)


def flatten_output(value: Any, to_numpy: Callable[[Any], np.ndarray | None]) -> list[tuple]:
    """[(key, ndarray)] of every array in a module output; non-array leaves are skipped.

    Tuples/lists give keys "0", "1", ...; mappings (HF ModelOutput too) and dataclasses their
    field names; nested levels are joined with '.'. `to_numpy` returns None for a non-array.
    """
    out: list[tuple[str, np.ndarray]] = []

    def walk(node, key: str, depth: int) -> None:
        array = to_numpy(node)
        if array is not None:
            out.append((key, array))
            return
        if depth >= MAX_DEPTH or node is None or isinstance(node, (str, bytes)):
            return
        if isinstance(node, Mapping):
            items = list(node.items())
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            items = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
        elif isinstance(node, (tuple, list)):
            items = list(enumerate(node))
        else:
            return  # e.g. a cache object: not an intermediate tensor
        for child_key, child in items:
            walk(child, f"{key}.{child_key}" if key else str(child_key), depth + 1)

    walk(value, "", 0)
    return out


# ----------------------------------------------------------------------------- torch
def _torch_to_numpy(value) -> np.ndarray | None:
    import torch

    if not isinstance(value, torch.Tensor):
        return None
    value = value.detach().cpu()
    if value.is_nested:  # torch.nn's encoder fast path: padding positions come back as zeros
        value = value.to_padded_tensor(0.0)
    if value.dtype == torch.bfloat16:
        value = value.float()
    return value.numpy()


def capture_torch_module(
    model, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> list[Captured]:
    """Run `model(*args, **kwargs)` under no_grad with a forward hook on every submodule.

    The model is run as given (the caller puts it in eval mode at the right dtype).
    """
    import torch

    captured: list[Captured] = []
    calls: dict[str, int] = {}

    def hook_for(name: str):
        def hook(_module, _inputs, output):
            call = calls.get(name, 0)
            calls[name] = call + 1
            for key, array in flatten_output(output, _torch_to_numpy):
                captured.append(Captured(name, key, call, array))

        return hook

    handles = [
        module.register_forward_hook(hook_for(name or ROOT))
        for name, module in model.named_modules()
    ]
    try:
        with torch.no_grad():
            model(*args, **dict(kwargs or {}))
    finally:
        for handle in handles:
            handle.remove()
    return captured


# ----------------------------------------------------------------------------- Flax
def _jax_to_numpy(value) -> np.ndarray | None:
    import jax

    if isinstance(value, (jax.Array, np.ndarray)):
        return np.asarray(value)
    return None


def flax_module_name(path: Sequence[str]) -> str:
    """A Flax module path joined with '/'; ROOT for the empty path (the model itself)."""
    return "/".join(path) if path else ROOT


@dataclasses.dataclass
class FlaxCapture:
    """Everything one Flax forward pass produced, in execution order, and each bound module by
    name (for its hyperparameters)."""

    values: list[Captured]
    modules: dict[str, Any]  # module name -> the bound module (its fields: eps, ...)


def capture_flax_module(
    module, variables: Mapping[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None
) -> FlaxCapture:
    """`module.apply(variables, *args, **kwargs)` with every `__call__` output and sown value."""
    from flax import linen as nn

    order: list[tuple[str, str, int]] = []  # (module, "__call__" | sown name, index) in order
    modules: dict[str, Any] = {}
    stack: list[Any] = []
    sown_seen: dict[tuple[str, str], int] = {}
    call_count: dict[str, int] = {}
    first_inputs: dict[tuple[str, int], Any] = {}  # (module, call) -> first positional input

    def note_sown(bound) -> None:
        """Record what `bound` has sown since the last look (sows happen in its own frame)."""
        name = flax_module_name(bound.path)
        collection = bound.scope.variables().get("intermediates", {})
        for key, value in collection.items():
            if key == "__call__" or isinstance(value, Mapping):
                continue
            seen = sown_seen.get((name, key), 0)
            for index in range(seen, len(value)):
                order.append((name, key, index))
            sown_seen[(name, key)] = len(value)

    def interceptor(next_fun, call_args, call_kwargs, context):
        if context.method_name != "__call__":
            return next_fun(*call_args, **call_kwargs)
        if stack:
            note_sown(stack[-1])
        bound = context.module
        name = flax_module_name(bound.path)
        modules.setdefault(name, bound)
        stack.append(bound)
        try:
            result = next_fun(*call_args, **call_kwargs)
            note_sown(bound)
        finally:
            stack.pop()
        order.append((name, "__call__", call_count.get(name, 0)))
        if call_args:
            first_inputs[name, call_count.get(name, 0)] = call_args[0]
        call_count[name] = call_count.get(name, 0) + 1
        return result

    variables = {k: v for k, v in variables.items() if k != "intermediates"}
    with nn.intercept_methods(interceptor):
        _, state = module.apply(
            variables,
            *args,
            **dict(kwargs or {}),
            capture_intermediates=True,
            mutable=["intermediates"],
        )
    stored = _by_module(state.get("intermediates", {}))
    values = []
    for name, key, index in order:
        outputs = stored.get(name, {}).get(key)
        if outputs is None or index >= len(outputs):
            continue  # e.g. a call the interceptor saw but capture_intermediates did not keep
        if key == "__call__":
            first_input = _jax_to_numpy(first_inputs.get((name, index)))
            for out_key, array in flatten_output(outputs[index], _jax_to_numpy):
                values.append(Captured(name, out_key, index, array, input=first_input))
        else:
            array = _jax_to_numpy(outputs[index])
            if array is not None:
                values.append(Captured(name, key, index, array, sown=True))
    return FlaxCapture(values, modules)


def _by_module(tree: Mapping[str, Any]) -> dict[str, dict[str, tuple]]:
    """The nested `intermediates` collection -> {module name: {value name: tuple of calls}}."""
    out: dict[str, dict[str, tuple]] = {}

    def walk(node, path):
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, path + (key,))
            else:
                out.setdefault(flax_module_name(path), {})[key] = tuple(value)

    walk(tree, ())
    return out
