def release_kv_cache(req, tree_cache, *, checkpoint=False):
    tree_cache.cache_finished_req(req)
