"""The KV-cache layout a case asks the server for (contiguous, or fragmented to a level).

A request's vocabulary, like the phases: the decoder asks for it, the engines apply it,
the verdict names it in the case key. Here, below all three.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayout:
    name: str  # contiguous | fragmented
    level: float

    @property
    def label(self) -> str:
        if self.name == "fragmented" and self.level < 1.0:
            return f"fragmented@{self.level:g}"
        return self.name
