class CudaGraphRunner:
    """The fork's graph runner (SGLang before the runner/ package had this name)."""

    def replay(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        self.graphs[forward_batch.batch_size].replay()
        return self.output_buffers[forward_batch.batch_size]
