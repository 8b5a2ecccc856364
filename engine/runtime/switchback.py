"""Which arm of a switchback Experiment the next engine step runs: blocks of block_steps steps in ABBA order
(incumbent, candidate, candidate, incumbent, ...), so each pair of adjacent blocks holds one block of each arm and
a trend in the traffic favours neither arm."""
from __future__ import annotations

from dataclasses import dataclass

from seam import EngineConfig, Experiment

ORDER = ("incumbent", "candidate", "candidate", "incumbent")


@dataclass(frozen=True)
class BlockStart:
    index: int
    arm: str
    config: EngineConfig


class Switchback:
    def __init__(self, experiment: Experiment):
        self.experiment = experiment
        self.index = -1
        self.steps = experiment.block_steps       # steps run in the current block; "full" before the first

    def due(self) -> BlockStart | None:
        """The block the next step starts, or None while the current block has steps left."""
        if self.steps < self.experiment.block_steps:
            return None
        self.index, self.steps = self.index + 1, 0
        arm = ORDER[self.index % len(ORDER)]
        return BlockStart(self.index, arm, getattr(self.experiment, arm))

    def stepped(self) -> None:
        self.steps += 1
