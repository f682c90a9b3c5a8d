class Scheduler:
    def flush_cache(self, empty_cache=True):
        if self.running_batch is not None:
            return False
        self.tree_cache.reset()
        self.token_to_kv_pool_allocator.clear()
        return True

    def on_idle(self):
        self.check_memory()
