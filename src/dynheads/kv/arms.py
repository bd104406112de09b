"""The arms of a KV run, resolved once from the config's names: each is a registered retention policy or a kvpress
press with its knobs, at a budget. The runner reads an arm's fields (what it needs, whether it is a press, whether
it keeps whole heads, costs a second tier or is the reference cache) and never parses its name again; records and
tables keep the name as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from dynheads.errors import DynheadsError, did_you_mean
from dynheads.kv.policies import KV_POLICIES, RetentionPolicy
from dynheads.kv.press_registry import KVPRESS_PRESSES, PressEntry, PressSpec

PRESS_PREFIX = "kvpress:"  # a policy name that names a kvpress press: kvpress:<press>[:key=value:...]


@dataclass(frozen=True)
class KVArm:
    """One (policy or press, budget) of a KV run. ``budget`` None: a budget-free policy (full, none). A press at a
    compression ``ratio`` (``--ratios``, kvpress's leaderboard protocol) carries the kept share ``1 - ratio`` as its
    budget, so its rows sort and join beside the policies' rows of about its size."""

    name: str  # as the config gives it ("static", "kvpress:snapkv:window_size=16")
    budget: float | None
    policy: RetentionPolicy | None = None  # a registered retention policy, or
    press: PressSpec | None = None  # a kvpress press and its knobs (its entry: ``press_entry``)
    ratio: float | None = None  # a press's own compression ratio; None: sized by the budget's bytes

    @property
    def press_entry(self) -> PressEntry | None:
        return KVPRESS_PRESSES.get(self.press.name) if self.press is not None else None

    @property
    def entry(self) -> RetentionPolicy | PressEntry:
        """Its registered entry: the retention policy's, or the press's."""
        return self.policy if self.policy is not None else cast(PressEntry, self.press_entry)

    @property
    def needs_static(self) -> bool:
        return self.entry.needs_static

    @property
    def needs_probe(self) -> bool:
        return self.entry.needs_probe

    @property
    def decodes_from_prefill(self) -> bool:
        """A retention policy decodes from the sample's shared full-attention prefill; a press the predictor votes
        for reads its hidden state (the others prefill under the press)."""
        return self.press is None or self.needs_probe

    @property
    def dynamic(self) -> bool:
        """Its head set changes per step: costed with a second tier (the full KV offloaded)."""
        return self.policy is not None and self.policy.dynamic

    @property
    def whole_heads(self) -> bool:
        """It keeps whole KV heads (a retention policy, a head-level press): its KV-head count is defined."""
        entry = self.press_entry
        return entry is None or entry.sizing == "heads"

    @property
    def reference(self) -> bool:
        """The unmodified cache (``full``), along which a given predictor's precision and recall is measured."""
        return self.policy is not None and self.policy.reference

    @property
    def kv_budget(self) -> float:
        """The budget its settings carry: a budget-free policy reads none, and carries 1 (every head)."""
        return 1.0 if self.budget is None else self.budget

    @property
    def record_id(self) -> str:
        """How its records are named after their sample: ``-<name>`` and, with a budget, ``-b<budget>`` (at a
        compression ratio, ``-r<ratio>``)."""
        if self.ratio is not None:
            return f"-{self.name}-r{self.ratio:g}"
        return f"-{self.name}" + ("" if self.budget is None else f"-b{self.budget:g}")


def resolve_arms(
    policies: Sequence[str],
    budgets: Sequence[float],
    *,
    static_given: bool,
    predictor_given: bool,
    ratios: Sequence[float] = (),
) -> list[KVArm]:
    """Every (policy or press, budget) arm of a run in run order (the registered policies in registration order,
    then the presses as given), each name parsed here once; one line for an unknown name, a budget outside (0, 1],
    a ratio outside [0, 1) or with no press to size, or a source an arm needs but was not given. With ``ratios``
    every press runs at each compression ratio instead of at each budget's bytes (a press that keeps whole heads is
    then refused)."""
    presses = [name for name in dict.fromkeys(policies) if name.startswith(PRESS_PREFIX)]
    unknown = [name for name in policies if name not in KV_POLICIES and not name.startswith(PRESS_PREFIX)]
    if unknown or not policies:
        known = KV_POLICIES.names() + [PRESS_PREFIX + name for name in KVPRESS_PRESSES.names()]
        raise DynheadsError(
            f"unknown or no KV policies {unknown}: use some of {KV_POLICIES.choices()} or "
            f"kvpress:<press> ({KVPRESS_PRESSES.choices()}){did_you_mean(unknown[0], known) if unknown else ''}"
        )
    repeated = [name for name in dict.fromkeys(policies) if list(policies).count(name) > 1]
    if repeated:
        raise DynheadsError(f"KV policy {repeated[0]!r} is given twice: each policy runs once (its row in the table)")
    parsed = {name: _checked_press(name) for name in presses}
    if not budgets or not all(0 < b <= 1 for b in budgets):
        raise DynheadsError(f"KV budgets are fractions of KV heads in (0, 1], got {list(budgets)}")
    registered = [name for name in KV_POLICIES.names() if name in policies]
    for name in registered:
        if KV_POLICIES.get(name).needs_static and not static_given:
            raise DynheadsError(f"the {name} KV policy needs a static head list: pass --static FILE")
    for name, press in parsed.items():
        if KVPRESS_PRESSES.get(press.name).needs_static and not static_given:
            raise DynheadsError(f"{name} is driven by a dynheads head list: pass --static FILE")
        if KVPRESS_PRESSES.get(press.name).needs_probe and not predictor_given:
            raise DynheadsError(f"{name} votes with the head predictor's heads: pass --predictor DIR")
    for name in registered:
        if KV_POLICIES.get(name).needs_probe and not predictor_given:
            raise DynheadsError(f"the {name} KV policy needs a trained probe: pass --predictor DIR")
    arms = [
        KVArm(name, budget, policy=KV_POLICIES.get(name))
        for name in registered
        for budget in ((None,) if KV_POLICIES.get(name).budget_free else sorted(budgets))
    ]
    if ratios and not parsed:
        shown = ",".join(f"{ratio:g}" for ratio in ratios)
        raise DynheadsError(
            f"--ratios {shown} sizes kvpress:<press> policies, and none is given: the retention policies keep "
            "whole KV heads at --budgets (add a kvpress: policy, or drop --ratios)"
        )
    if ratios:
        return arms + _ratio_arms(parsed, ratios)
    return arms + [KVArm(name, budget, press=press) for name, press in parsed.items() for budget in sorted(budgets)]


def _ratio_arms(parsed: dict[str, PressSpec], ratios: Sequence[float]) -> list[KVArm]:
    """Each press at each compression ratio, smallest cache first."""
    if not all(0 <= r < 1 for r in ratios):
        raise DynheadsError(
            f"compression ratios are the share of the compressed tokens removed, in [0, 1), got {list(ratios)}"
        )
    whole = [name for name, press in parsed.items() if KVPRESS_PRESSES.get(press.name).sizing == "heads"]
    if whole:
        raise DynheadsError(
            f"{', '.join(whole)} keeps whole KV heads, not a share of the tokens: "
            "run it with --budgets, without --ratios"
        )
    return [
        KVArm(name, round(1 - ratio, 9), press=press, ratio=ratio)
        for name, press in parsed.items()
        for ratio in sorted(ratios, reverse=True)
    ]


def _checked_press(name: str) -> PressSpec:
    from dynheads.kv.press_runs import check_press  # kvpress's presses (and torch): only when a press is asked for

    return check_press(name)
