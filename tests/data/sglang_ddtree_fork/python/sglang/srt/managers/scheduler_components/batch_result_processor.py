class SchedulerBatchResultProcessor:
    def process_batch_result_decode(self, batch, result):
        result.copy_done.synchronize()
        for req, n in zip(batch.reqs, result.accept_lens.tolist()):
            req.output_ids.extend(result.next_token_ids[:n])
        self.output_streamer.stream_output(batch.reqs, batch.return_logprob)
