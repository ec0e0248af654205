"""The one switch object of the native kernels: `KERNELS`, with a `Switch` per kernel (`int8`,
`f32`, `reorder`), each read from its environment variable:

    FLAX_TRANSFORMER_INT8_KERNEL    = auto | xla | amx | avx2      (int8 products, packed)
    FLAX_TRANSFORMER_F32_KERNEL     = auto | xla | avx512 | avx2   (float32 products, packed)
    FLAX_TRANSFORMER_REORDER_KERNEL = auto | xla | native          (beam search's cache reorder)

`auto` (the default): the kernel where it runs, else XLA's own operation; `xla`: XLA's always;
a build's name: that kernel, and an error (SwitchError: one line, exit 2 in every command) where
it cannot run. A kernel runs where the platform is Linux x86-64, JAX computes on the CPU, the
CPU has the flags it was compiled for, and its library was built by `ftx kernels build` and is
intact (kernels.cache). Nothing here compiles; `choose` loads a built library (kernels.load),
`preflight` only looks (no JAX: the commands call it before anything else).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from flax_transformer.files.settings import SettingError
from flax_transformer.kernels import cache, cpu
from flax_transformer.kernels.libraries import LIBRARIES


class SwitchError(SettingError):
    """A kernel switch with a value it does not take, or forcing a kernel that cannot run here."""


@dataclass(frozen=True)
class Choice:
    """What a switch chose: `build` (the switch value naming it, e.g. "avx2") and `library`, or
    both None and `why` XLA's operation runs."""

    build: str | None
    library: str | None
    why: str | None


@dataclass(frozen=True)
class Switch:
    """One kernel's switch: its `variable`, its `builds` (switch value -> library name, the
    preferred first), what the kernel does and what runs without it."""

    name: str
    variable: str
    builds: tuple[tuple[str, str], ...]
    what: str
    fallback: str

    @property
    def choices(self) -> tuple[str, ...]:
        """The values the variable takes: auto, xla, then each build's name."""
        return ("auto", "xla", *(value for value, _ in self.builds))

    def value(self) -> str:
        """The variable's value (default auto); SwitchError naming it and its values otherwise."""
        raw = os.environ.get(self.variable, "auto")
        value = raw.strip().lower() or "auto"
        if value not in self.choices:
            raise SwitchError(
                f"{self.variable}={raw!r} is not a kernel switch value: use one of "
                f"{', '.join(self.choices)} (auto: {self.what} where it runs, else "
                f"{self.fallback}; xla: always {self.fallback})"
            )
        return value

    def _candidates(self, value: str) -> list[tuple[str, str]]:
        return list(self.builds) if value == "auto" else [b for b in self.builds if b[0] == value]

    def _decide(self, why_not) -> Choice:
        value = self.value()
        if value == "xla":
            return Choice(None, None, f"{self.variable}=xla")
        reasons = []
        for build, library in self._candidates(value):
            why = why_not(library)
            if why is None:
                return Choice(build, library, None)
            reasons.append(f"{build}: {why}" if len(self.builds) > 1 else why)
        if value != "auto":
            raise SwitchError(
                f"{self.variable}={value}, but {self.what} cannot run here: {why} "
                f"(set {self.variable} to auto or xla for {self.fallback})"
            )
        return Choice(None, None, "; ".join(reasons))

    def choose(self) -> Choice:
        """Which build runs (loading its library, once), or why XLA's operation does."""
        choice = self._decide(_why_not_loaded)
        if choice.library is None and self.value() == "auto":
            _say_if_not_built(self)
        return choice

    def active(self) -> bool:
        """Whether the kernel runs (see `choose`); SwitchError when forced and it cannot."""
        return self.choose().library is not None

    def reason_unavailable(self) -> str | None:
        """None when the kernel runs, else why not (SwitchError when forced and it cannot)."""
        return self.choose().why

    def status(self) -> dict:
        """What `ftx info` shows of this kernel: the switch, whether it runs (which build and
        library) or why not, and what runs instead."""
        state = {"kernel": self.name, "variable": self.variable, "fallback": self.fallback}
        try:
            state["value"] = self.value()
            choice = self.choose()
        except SwitchError as err:
            return state | {"active": False, "build": None, "library": None, "why": str(err)}
        library = None
        if choice.library is not None:
            library = str(cache.library_path(LIBRARIES[choice.library]))
        return state | {
            "active": choice.library is not None,
            "build": choice.build,
            "library": library,
            "why": choice.why,
        }

    def preflight(self) -> str | None:
        """Without JAX and without loading anything: None when the switch's value is valid and,
        for a forced kernel, its platform, CPU and built library are there; else the one line
        a command prints (the JAX backend and the load are checked when the kernel is used)."""
        try:
            if self.value() not in ("auto", "xla"):  # auto never fails: it falls back
                self._decide(_why_not_seen)
        except SwitchError as err:
            return str(err)
        return None


def _why_not_seen(library: str) -> str | None:
    lib = LIBRARIES[library]
    return cpu.platform_problem() or cpu.missing_flags(lib.cpu) or cache.check(lib).problem


def _why_not_loaded(library: str) -> str | None:
    why = cpu.platform_problem()
    if why is not None:
        return why
    import jax

    if jax.default_backend() != "cpu":  # a jitted program on a GPU cannot call a CPU kernel
        return f"the kernels run on the CPU, JAX computes on {jax.default_backend()} here"
    why = cpu.missing_flags(LIBRARIES[library].cpu)
    if why is not None:
        return why
    from flax_transformer.kernels import load

    return load.load(library)[1]


def _say_if_not_built(switch: Switch) -> None:
    """One line per process when a kernel that would run here is not built."""
    from flax_transformer.kernels import load

    for _, library in switch.builds:
        if cpu.platform_problem() or cpu.missing_flags(LIBRARIES[library].cpu):
            continue
        if load.state(library) == "missing":
            load.notice(
                "not built",
                f"the native kernels are not built, XLA's own operations run (`ftx kernels "
                f"build` builds them into {cache.kernel_dir()}; `ftx info` shows each kernel)",
            )
        return


class Kernels:
    """The one switch object: `KERNELS.int8`, `.f32`, `.reorder`; iterating gives the three."""

    int8 = Switch(
        "int8", "FLAX_TRANSFORMER_INT8_KERNEL", (("amx", "int8_amx"), ("avx2", "int8_avx2")),
        "the packed int8 kernel", "XLA's int8 dot",
    )  # fmt: skip
    f32 = Switch(
        "f32", "FLAX_TRANSFORMER_F32_KERNEL",
        (("avx512", "f32_packed_avx512"), ("avx2", "f32_packed_avx2")),
        "the packed float32 kernel", "XLA's dot",
    )  # fmt: skip
    reorder = Switch(
        "reorder", "FLAX_TRANSFORMER_REORDER_KERNEL", (("native", "beam_reorder"),),
        "the in-place beam reorder kernel", "XLA's gather",
    )  # fmt: skip

    def __iter__(self):
        return iter((self.int8, self.f32, self.reorder))

    def preflight(self) -> str | None:
        """The first switch problem (see Switch.preflight), or None: what a command checks
        before it starts."""
        for switch in self:
            problem = switch.preflight()
            if problem is not None:
                return problem
        return None


KERNELS = Kernels()
