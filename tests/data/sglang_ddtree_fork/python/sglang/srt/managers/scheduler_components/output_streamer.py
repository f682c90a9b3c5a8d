class SchedulerOutputStreamer:
    def stream_output(self, reqs, return_logprob, skip_req=None):
        for req in reqs:
            self.send_to_detokenizer.send(req.output_ids)
