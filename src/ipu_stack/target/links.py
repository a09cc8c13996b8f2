"""Several C600 cards joined by IPU-Links: the system a multi-chip compile plans for.

The cards of a C600 cluster are joined in a line (``ipuLinkTopology: line``): card ``k``
talks to cards ``k - 1`` and ``k + 1`` over one cable of 2 IPU-Links.  A tower pipelined
over the cards hands one activation from each card to the next once a step, so only the
neighbour links carry traffic and a hand-off is always one hop.  What a hand-off costs
(bytes over the cable's rate, the hop, the sync across cards) is priced in
``target.timing`` (``link_*``), which both the planner and the device read; the facts here
are the system's shape.  Every figure has its source, or says "assumed".
"""

from __future__ import annotations

from dataclasses import dataclass

from ipu_stack.target.machine import Fact, Target, get_target
from ipu_stack.util.errors import UsageError

_BYTEMLPERF = "ByteMLPerf IPU backend README (bytedance/ByteMLPerf, byte_mlperf/backends/IPU)"

LINK_FACTS: dict[str, Fact] = {
    "links_per_card": Fact(4, f"{_BYTEMLPERF}: 4 IPU-Links, 1 Tbps bidirectional in all"),
    "links_per_cable": Fact(2, f"{_BYTEMLPERF}: each pair of cards is joined by a cable "
                               "carrying 2 IPU-Links"),
    "max_cards": Fact(8, f"{_BYTEMLPERF}: up to 8 cards in a cluster"),
    "hops_per_handoff": Fact(1, "line topology (ipuLinkTopology: line, same README): "
                                "consecutive pipeline stages sit on neighbouring cards"),
}


@dataclass(frozen=True)
class System:
    """``chips`` cards of ``chip`` in a line, each with its own tiles and memory."""

    chip: Target
    chips: int

    @property
    def topology(self) -> str:
        return "line"

    def to_json(self) -> dict[str, object]:
        return {"chips": self.chips, "chip": self.chip.name, "topology": self.topology,
                **{k: f.value for k, f in LINK_FACTS.items()}}


def get_system(target: str, chips: int, option: str = "--chips") -> System:
    """``chips`` cards of ``target``, or a one-line reason that cannot be built, naming the
    ``option`` that gave the count."""
    cards = int(LINK_FACTS["max_cards"].value)
    if not 1 <= chips <= cards:
        raise UsageError(f"{option} {chips}: a C600 cluster holds 1 to {cards} cards")
    return System(get_target(target), chips)


__all__ = ["LINK_FACTS", "System", "get_system"]
