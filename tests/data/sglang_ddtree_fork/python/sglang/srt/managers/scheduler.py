class Scheduler:
    def event_loop_normal(self):
        while True:
            self.ingest_requests()
            batch = self.get_next_batch_to_run(self.running_batch, self.last_batch)
            if batch:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
            else:
                self.on_idle()
            self.last_batch = batch

    def ingest_requests(self, stop_at_pause=False):
        recv_reqs = self.request_receiver.recv_requests()
        self.waiting_queue.extend(recv_reqs)
        return recv_reqs

    def get_next_batch_to_run(self, running_batch, last_batch):
        running_batch.prepare_for_decode()
        return running_batch

    def run_batch(self, batch, pp_proxy_tensors=None):
        result = self.model_worker.forward_batch_generation(batch)
        batch.seq_lens_cpu = result.new_seq_lens.to("cpu")
        return result

    def launch_batch_sample_if_needed(self, batch_result, cur_batch):
        return None

    def process_batch_result(self, batch, result):
        self.batch_result_processor.process_batch_result_decode(batch, result)

    def flush_cache(self, empty_cache=True):
        if self.running_batch is not None:
            return False
        self.tree_cache.reset()
        self.token_to_kv_pool_allocator.clear()
        return True

    def on_idle(self):
        self.check_memory()
