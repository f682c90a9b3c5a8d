class ModelRunner:
    def __init__(self, is_draft_worker=False):
        self.is_draft_worker = is_draft_worker

    def forward(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)
        return self.forward_extend(forward_batch)

    def forward_extend(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def write_kv(self, hidden_states, accepted):
        return None
