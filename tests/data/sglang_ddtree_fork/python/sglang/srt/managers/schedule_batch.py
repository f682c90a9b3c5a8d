class ScheduleBatch:
    def prepare_for_decode(self):
        self.spec_info.prepare_for_decode(self)
