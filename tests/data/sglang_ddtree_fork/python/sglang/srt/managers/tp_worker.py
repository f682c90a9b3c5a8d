class TpModelWorker:
    def forward_batch_generation(
        self, model_worker_batch, launch_done=None, skip_sample=False, is_verify=False
    ):
        return self.model_runner.forward(model_worker_batch)

    def alloc_verify_slots(self, batch, n):
        return batch.allocator.alloc(n)
