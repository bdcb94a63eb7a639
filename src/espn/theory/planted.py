"""The planted shallow-network model ``y = sigma(v_t^T psi(W* x)) + Z`` of the paper's
"Application to Shallow Networks" (docs/theory.md), with a known noise floor ``E[Z^2]``."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from espn.theory.config import (
    ACTIVATIONS,
    INPUT_DISTRIBUTIONS,
    PlantedConfig,
    TheoryConfigError,
    check_choice,
    check_ns,
)

DTYPE = torch.float64
#: the function psi of each of :data:`~espn.theory.config.ACTIVATIONS`
PSI: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda z: z,
    "relu": torch.relu,
}


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation ``psi`` called ``name`` (identity or relu)."""
    return PSI[check_choice("activation", name, ACTIVATIONS)]


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any printable parts (same value in every process)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def generator(*parts: object) -> torch.Generator:
    """A CPU generator seeded by :func:`derive_seed` of ``parts``."""
    return torch.Generator().manual_seed(derive_seed(*parts))


def sample_inputs(
    n: int, d: int, gen: torch.Generator, distribution: str = "sphere"
) -> torch.Tensor:
    """``n`` inputs of radius ``sqrt(d)``: on the sphere, or uniform in the ball."""
    check_choice("inputs", distribution, INPUT_DISTRIBUTIONS)
    g = torch.randn(n, d, generator=gen, dtype=DTYPE)
    x = g / g.norm(dim=1, keepdim=True) * d**0.5
    if distribution == "ball":
        x = x * torch.rand(n, 1, generator=gen, dtype=DTYPE) ** (1.0 / d)
    return x


@dataclass
class TaskData:
    """Per-task training or test sets: ``X[t]`` is (N_t, d), ``y[t]`` is (N_t,)."""

    X: list[torch.Tensor]
    y: list[torch.Tensor]

    @property
    def sizes(self) -> list[int]:
        """Number of samples of each task."""
        return [len(y) for y in self.y]

    def head(self, n: int | Sequence[int]) -> TaskData:
        """The first ``n`` samples of each task (``n`` per task, or one value for all)."""
        ns = [n] * len(self.X) if isinstance(n, int) else list(n)
        return TaskData(
            [x[:k] for x, k in zip(self.X, ns, strict=True)],
            [y[:k] for y, k in zip(self.y, ns, strict=True)],
        )

    def select(self, tasks: Sequence[int]) -> TaskData:
        """The tasks with the given indices, in that order."""
        return TaskData([self.X[t] for t in tasks], [self.y[t] for t in tasks])


@dataclass
class PlantedModel:
    """Ground truth ``W*`` (r x d), heads ``V`` (T x r), activation and noise level."""

    W: torch.Tensor
    V: torch.Tensor
    activation: str = "relu"
    noise: float = 0.5
    inputs: str = "sphere"

    @property
    def d(self) -> int:
        """Input dimension."""
        return self.W.shape[1]

    @property
    def r(self) -> int:
        """Representation dimension (rows of ``W*``)."""
        return self.W.shape[0]

    @property
    def T(self) -> int:
        """Number of tasks."""
        return self.V.shape[0]

    @property
    def noise_floor(self) -> float:
        """``E[Z^2]`` for ``Z ~ Uniform[-noise, noise]``: the optimal risk ``L*``."""
        return self.noise**2 / 3.0

    @classmethod
    def create(
        cls,
        d: int,
        r: int,
        tasks: int,
        activation: str = "relu",
        noise: float = 0.5,
        head_norm: float = 2.5,
        seed: int = 0,
        inputs: str = "sphere",
    ) -> PlantedModel:
        """Draw ``W*`` with orthonormal rows and ``tasks`` heads of norm ``head_norm``, the
        values checked as :class:`~espn.theory.config.PlantedConfig` checks them."""
        PlantedConfig(
            d=d,
            r=r,
            tasks=tasks,
            activation=activation,
            noise=noise,
            head_norm=head_norm,
            inputs=inputs,
        ).validate()
        gen = generator("planted", seed, d, r, tasks)
        q, _ = torch.linalg.qr(torch.randn(d, r, generator=gen, dtype=DTYPE))
        heads = torch.randn(tasks, r, generator=gen, dtype=DTYPE)
        heads = heads / heads.norm(dim=1, keepdim=True) * head_norm
        return cls(W=q.T.contiguous(), V=heads, activation=activation, noise=noise, inputs=inputs)

    def clean(self, X: torch.Tensor, task: int) -> torch.Tensor:
        """Noise-free label ``sigma(v_t^T psi(W* x))`` of each row of ``X``."""
        psi = activation_fn(self.activation)
        return torch.sigmoid(psi(X @ self.W.T) @ self.V[task])

    def sample(self, n: int | Sequence[int], gen: torch.Generator) -> tuple[TaskData, TaskData]:
        """``n`` samples per task (or ``n[t]`` for task ``t``): the noisy data set and the same
        inputs with clean labels (which give exact excess risks)."""
        ns = [n] * self.T if isinstance(n, int) else list(n)
        if len(ns) != self.T:
            raise TheoryConfigError(f"need one sample size per task ({self.T}), got {len(ns)}")
        check_ns(ns)
        Xs, noisy_y, clean_y = [], [], []
        for t, k in enumerate(ns):
            X = sample_inputs(k, self.d, gen, self.inputs)
            f = self.clean(X, t)
            z = (2 * torch.rand(k, generator=gen, dtype=DTYPE) - 1) * self.noise
            Xs.append(X)
            clean_y.append(f)
            noisy_y.append(f + z)
        return TaskData(Xs, noisy_y), TaskData(Xs, clean_y)

    def frozen(self, r_frz: int, perturbation: float = 0.0, seed: int = 0) -> torch.Tensor:
        """The frozen ``W_frz``: the first ``r_frz`` rows of ``W*``, each ``w*_i + eps * e_i``
        with ``e_i`` random, orthogonal to ``W*``'s rows and of ``w*_i``'s norm (``eps > 0``:
        the features leave the span the tasks need, so the mismatch ``MM`` is positive)."""

        if not 0 <= r_frz <= self.r:
            raise TheoryConfigError(f"must be in [0, r={self.r}], got {r_frz}", "r_frz")
        if perturbation < 0:
            raise TheoryConfigError(f"must be >= 0, got {perturbation:g}", "perturbation")
        W = self.W[:r_frz].clone()
        if perturbation > 0 and r_frz > 0:
            gen = generator("perturb", seed, r_frz, self.d)
            E = torch.randn(r_frz, self.d, generator=gen, dtype=DTYPE)
            E = E - (E @ self.W.T) @ self.W  # orthogonal to the row space of W*
            E = E / E.norm(dim=1, keepdim=True) * W.norm(dim=1, keepdim=True)
            W = W + perturbation * E
        return W
