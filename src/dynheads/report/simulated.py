"""Studies whose answer is known: simulated per-step head sets and hidden states for ``report.rules``.

A ``World`` is one simulated model: ``layers x heads`` heads, a static frequency profile (Zipf weights over a seeded
order of the heads) and, when the claim is true by construction, ``modes`` context-specific profiles (each a few
heads of its own). A study draws ``samples`` answers of ``steps`` steps from one world:

- **static** worlds (Claim 1 false): every step draws its heads from the one static profile, whatever the
  context; the heads still change from step to step (a random rotation within a fixed pool, the paper's App. B
  words), but nothing about the step says which. ``alpha`` sets how concentrated the profile is.
- **timing** (``timing="hidden"``): retrieval happens at some steps only (a latent copy state per step, as when a
  UUID's characters are copied), the hidden state knows when, the heads still come from the static profile: a
  predictor can tell *when* but not *which*. ``timing="position"``: the copy steps are the same step indices in
  every sample and the hidden state encodes the step index: what every answer shares at its t-th token.
- **dynamic** worlds (Claims 1 and 3 true): each step's context (one of ``modes``, switching between steps) picks
  its own heads (``mode_share`` of the mass) on top of the static profile, and the hidden state encodes the
  context, so heads are step- and sample-specific and the hidden state predicts them.
- **shares** (``targets="shares"``): Eq. 2's continuous scores instead of sets, as the HotpotQA stages trace them.
  Every head has a static logit (spread ``spread``), every step adds unit noise, a step's context lifts its own
  ``mode_heads`` heads by ``boost`` (dynamic worlds), and ``timing="hidden"`` lowers every head by ``boost`` at the
  steps that do not retrieve; the share is the logit's sigmoid. D_t is every head above the level at which the
  fitting stream's steps hold ``mean_size`` heads on average (the preset's ``calibrated:10``, fitted apart from the
  evaluated samples). Claim 1's predictor is trained on those sets (``set_samples``), as the study's
  ``hotpotqa-set-probe`` is; ``score_samples`` gives the shares themselves (Claim 3's regressor).

Each study also draws a fitting stream from the same world (``fit_samples`` answers) whose head frequencies give
the static list, as the study fits static heads on samples it never evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dynheads.thresholds import fit_absolute

Timing = Literal["none", "hidden", "position"]
Targets = Literal["sets", "shares"]
SHARE_LOGIT = -3.0  # shares: the mean static logit (a head's typical share about 0.05)


@dataclass(frozen=True)
class WorldSpec:
    """How a simulated model behaves (see the module docstring)."""

    layers: int = 30
    heads: int = 9
    mean_size: float = 5.0  # mean |D_t| over all steps
    alpha: float = 1.0  # Zipf exponent of the static profile (larger: more concentrated)
    modes: int = 0  # context-specific profiles (0: a static world)
    mode_heads: int = 20  # heads each context favours
    mode_share: float = 0.7  # share of a step's head mass from its context's profile
    switch: float = 0.7  # probability that the context changes between two steps
    timing: Timing = "none"
    copy_rate: float = 0.6  # share of steps that retrieve when ``timing`` is not "none"
    hidden_dim: int = 32
    signal: float = 1.0  # scale of what the hidden state encodes, against unit noise
    lookahead: float = 0.0  # how strongly the hidden state also encodes the next step's context (planning)
    targets: Targets = "sets"  # "shares": continuous Eq. 2-like scores, D_t above a fitted level
    spread: float = 1.5  # shares: sd of the heads' static logits
    boost: float = 2.5  # shares: logit lift of the heads a step's context favours


@dataclass(frozen=True)
class SimulatedStudy:
    """Samples of ``(hidden [T, dim] float32, targets [T, L*H])`` (bool sets, or float shares with the ``level``
    that makes them sets) and the static ranking fitted apart from them."""

    samples: list[tuple[np.ndarray, np.ndarray]]
    static_ranking: list[tuple[int, int]]
    shape: tuple[int, int]
    level: float | None = None  # shares: D_t is every head above it (fitted on the fitting stream)

    def dynamic_sets(self) -> list[np.ndarray]:
        """The samples' sets as ``[T, layers, heads]`` arrays (``analysis.dynamism``'s input)."""
        return [_as_sets(targets, self.level).reshape(len(targets), *self.shape) for _, targets in self.samples]

    def set_samples(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(hidden, sets [T, L*H] float32)`` pairs: D_t as 0/1 targets (the set classifier's input)."""
        return [(hidden, _as_sets(targets, self.level).astype(np.float32)) for hidden, targets in self.samples]

    def score_samples(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(hidden, scores [T, L*H] float32)`` pairs (the CCA's and the head predictor's input): 0/1 sets, or the
        shares themselves."""
        return [(hidden, targets.astype(np.float32)) for hidden, targets in self.samples]


def _as_sets(targets: np.ndarray, level: float | None) -> np.ndarray:
    return targets if level is None else targets > level


class World:
    """One simulated model drawn from ``spec`` with ``rng``."""

    def __init__(self, spec: WorldSpec, rng: np.random.Generator, steps: int):
        self.spec, self.rng, self.steps = spec, rng, steps
        total = spec.layers * spec.heads
        weights = (np.arange(total) + 1.0) ** (-spec.alpha)
        self.profile = np.zeros(total)
        self.profile[rng.permutation(total)] = weights / weights.sum()
        self.mode_profiles = [self._mode_profile(total) for _ in range(spec.modes)]
        self.mode_embedding = rng.normal(size=(max(spec.modes, 1), spec.hidden_dim))
        self.copy_embedding = rng.normal(size=spec.hidden_dim)
        self.position_embedding = rng.normal(size=(steps, spec.hidden_dim))
        self.copy_steps = rng.random(steps) < spec.copy_rate  # timing="position": the same steps in every answer
        if spec.targets == "shares":  # drawn last: a sets world draws exactly what it drew before shares existed
            self.static_logit = rng.normal(SHARE_LOGIT, spec.spread, total)
            self.mode_heads = [rng.choice(total, spec.mode_heads, replace=False) for _ in range(spec.modes)]

    def _mode_profile(self, total: int) -> np.ndarray:
        chosen = self.rng.choice(total, self.spec.mode_heads, replace=False)
        profile = np.zeros(total)
        profile[chosen] = 1.0 / (np.arange(self.spec.mode_heads) + 1.0)
        return profile / profile.sum()

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        """One answer: hidden states and head sets (or shares)."""
        spec, rng = self.spec, self.rng
        copying = self._copying()
        sizes = self._sizes(copying) if spec.targets == "sets" else None
        noise = rng.normal(size=(self.steps, spec.hidden_dim))
        modes = self._modes()
        hidden = self._hidden(noise, copying, modes)
        return hidden, self._shares(copying, modes) if sizes is None else self._sets(sizes, modes)

    def _hidden(self, noise: np.ndarray, copying: np.ndarray, modes: np.ndarray) -> np.ndarray:
        """``noise`` plus what the world lets the hidden state know: the step's context (and the next one's, with
        ``lookahead``), whether it retrieves (``timing="hidden"``) or its index (``timing="position"``)."""
        spec, hidden = self.spec, noise
        if spec.modes:
            hidden += spec.signal * self.mode_embedding[modes]
            hidden[:-1] += spec.signal * spec.lookahead * self.mode_embedding[modes[1:]]
        if spec.timing == "hidden":
            hidden += spec.signal * copying[:, None] * self.copy_embedding
        elif spec.timing == "position":
            hidden += spec.signal * self.position_embedding
        return hidden.astype(np.float32)

    def _sets(self, sizes: np.ndarray, modes: np.ndarray) -> np.ndarray:
        """Each step's |D_t| heads drawn from the static profile, mixed with its context's (dynamic worlds)."""
        spec, rng = self.spec, self.rng
        total = spec.layers * spec.heads
        sets = np.zeros((self.steps, total), dtype=bool)
        for t in range(self.steps):
            profile = self.profile
            if spec.modes:
                profile = (1 - spec.mode_share) * self.profile + spec.mode_share * self.mode_profiles[modes[t]]
            size = min(int(sizes[t]), int((profile > 0).sum()))
            if size:
                sets[t, rng.choice(total, size, replace=False, p=profile)] = True
        return sets

    def _shares(self, copying: np.ndarray, modes: np.ndarray) -> np.ndarray:
        """Eq. 2-like shares: the sigmoid of each head's static logit, unit noise per step, ``boost`` for the heads
        of the step's context and minus ``boost`` at steps that do not retrieve."""
        spec = self.spec
        logits = self.static_logit + self.rng.normal(size=(self.steps, spec.layers * spec.heads))
        for t in range(self.steps) if spec.modes else ():
            logits[t, self.mode_heads[modes[t]]] += spec.boost
        logits[~copying] -= spec.boost
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)

    def _modes(self) -> np.ndarray:
        """The context of each step: a first draw, then a new draw with probability ``switch`` at every step."""
        count = max(self.spec.modes, 1)
        modes = self.rng.choice(count, size=self.steps)  # a draw per step (not a resample of data)
        keep = self.rng.random(self.steps) >= self.spec.switch
        for t in range(1, self.steps):
            if keep[t]:
                modes[t] = modes[t - 1]
        return modes

    def _copying(self) -> np.ndarray:
        """Which steps retrieve: all (no timing), a draw per step (hidden), or the world's fixed steps (position)."""
        if self.spec.timing == "none":
            return np.ones(self.steps, dtype=bool)
        if self.spec.timing == "position":
            return self.copy_steps
        return self.rng.random(self.steps) < self.spec.copy_rate

    def _sizes(self, copying: np.ndarray) -> np.ndarray:
        """|D_t| per step: a gamma-Poisson draw of mean ``mean_size`` over all steps (sd about 0.6 of the mean, some
        empty steps, as traced models show), 0 at steps that do not retrieve."""
        share = max(float(copying.mean()), 1.0 / self.steps)
        mean = self.spec.mean_size / share
        shape = 2.5  # gamma shape: the sizes' spread
        return np.where(copying, self.rng.poisson(self.rng.gamma(shape, mean / shape, self.steps)), 0)


def simulate_study(
    spec: WorldSpec, samples: int, rng: np.random.Generator, *, steps: int = 32, fit_samples: int = 20
) -> SimulatedStudy:
    """One study: a world drawn from ``spec``, ``samples`` evaluated answers and a static list fitted on
    ``fit_samples`` other answers of the same world (heads ranked by how often they were dynamic there; for shares,
    D_t's level is fitted there too)."""
    world = World(spec, rng, steps)
    fitting = [world.sample()[1] for _ in range(fit_samples)]
    level = fitted_level(fitting, spec.mean_size) if spec.targets == "shares" else None
    counts = np.sum([_as_sets(targets, level).sum(axis=0) for targets in fitting], axis=0)
    order = [int(i) for i in np.argsort(-counts, kind="stable") if counts[i] > 0]
    ranking = [(i // spec.heads, i % spec.heads) for i in order]
    evaluated = [world.sample() for _ in range(samples)]
    return SimulatedStudy(evaluated, ranking, (spec.layers, spec.heads), level)


def fitted_level(fitting: list[np.ndarray], mean_size: float) -> float:
    """The share above which the fitting stream's steps hold ``mean_size`` heads on average: the study's own fit
    (``thresholds.fit_absolute``, ``calibrated:K``'s for a share whose chance level does not move)."""
    return fit_absolute([targets[:, None, :] for targets in fitting], mean_size)
