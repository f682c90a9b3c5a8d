import torch


class DDTreeVerifyInput:
    """A draft tree flattened for one target forward, with its attention mask."""

    def __init__(self, draft_tokens, tree_mask, parents, positions):
        self.draft_tokens = draft_tokens
        self.tree_mask = tree_mask
        self.parents = parents
        self.positions = positions

    def prepare_for_verify(self, batch, target_worker):
        batch.input_ids = self.draft_tokens.flatten()
        batch.out_cache_loc = target_worker.alloc_verify_slots(batch, self.draft_tokens.numel())
        batch.spec_info = self
        return torch.ones_like(self.tree_mask)
