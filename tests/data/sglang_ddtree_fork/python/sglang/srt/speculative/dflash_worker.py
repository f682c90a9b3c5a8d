import torch
from sglang.srt.speculative.dflash_info import DDTreeVerifyInput


class DFlashWorker:
    """DFlash drafting with DDTree verification (a fork's worker, not upstream's V2)."""

    def __init__(self, server_args, target_worker, draft_model_runner):
        self.target_worker = target_worker
        self.draft_model_runner = draft_model_runner
        self.block_size = server_args.speculative_dflash_block_size
        self.tree_stats = []

    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            return self._forward_prefill(batch)
        forward_batch = self._prepare_draft_batch(batch)
        draft_out = self.draft_model_runner.forward(forward_batch)
        draft_tokens = self._sample_draft_tokens(draft_out)
        verify_input = self._build_ddtree_verify_input(batch, draft_tokens)
        verify_input.prepare_for_verify(batch, self.target_worker)
        result = self.target_worker.forward_batch_generation(batch, is_verify=True)
        accepted = self._ddtree_accept(verify_input, result)
        self._update_acceptance_stats(verify_input, accepted)
        self._append_target_hidden_to_draft_kv(result, accepted)
        if on_publish is not None:
            on_publish(result)
        return result

    def _forward_prefill(self, batch):
        return self.target_worker.forward_batch_generation(batch)

    def _prepare_draft_batch(self, batch):
        return batch

    def _sample_draft_tokens(self, draft_out):
        return torch.argmax(draft_out.logits, dim=-1)

    def _build_ddtree_verify_input(self, batch, draft_tokens):
        parents = self._tree_parents(draft_tokens)
        mask = self._tree_mask(parents)
        return DDTreeVerifyInput(draft_tokens, mask, parents, batch.seq_lens)

    def _tree_parents(self, draft_tokens):
        return torch.arange(draft_tokens.shape[-1]) - 1

    def _tree_mask(self, parents):
        return parents[:, None] >= parents[None, :]

    def _ddtree_accept(self, verify_input, result):
        target = torch.argmax(result.logits, dim=-1)
        return (target == verify_input.draft_tokens).cumprod(-1).sum(-1)

    def _update_acceptance_stats(self, verify_input, accepted):
        self.tree_stats.append(accepted.tolist())

    def _append_target_hidden_to_draft_kv(self, result, accepted):
        self.draft_model_runner.write_kv(result.hidden_states, accepted)
