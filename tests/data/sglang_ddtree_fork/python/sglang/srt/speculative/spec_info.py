from enum import Enum, auto


class SpeculativeAlgorithm(Enum):
    DFLASH = auto()
    EAGLE = auto()
    NONE = auto()

    def is_dflash(self) -> bool:
        return self == SpeculativeAlgorithm.DFLASH

    def is_eagle(self) -> bool:
        return self == SpeculativeAlgorithm.EAGLE

    def create_worker(self, server_args):
        assert self != SpeculativeAlgorithm.NONE
        if self.is_dflash():
            from sglang.srt.speculative.dflash_worker import DFlashWorker

            return DFlashWorker
        elif self.is_eagle():
            from sglang.srt.speculative.eagle_worker import EAGLEWorker

            return EAGLEWorker
        raise ValueError("Unreachable code path in create_worker.")
