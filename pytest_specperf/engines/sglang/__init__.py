"""The ``sglang`` backend: launch SGLang, probe its schedulers through its plugin entry point.

Modules, one concern each (none imports SGLang or torch at import time):

- :mod:`.backend`: ``SGLangBackend``, the plugin-side ``Backend`` implementation;
- :mod:`.launcher`: command line, environment and pass-through argument checks;
- :mod:`.source`: locating and ``ast``-parsing the installed SGLang source;
- :mod:`.phase_map` + ``phase_map_<version>.yaml``: which SGLang callable is which phase;
- :mod:`.sgl_plugin`: the ``sglang.srt.plugins`` entry point run inside SGLang;
- :mod:`.hooks`: the hook functions and per-process probe state inside the scheduler;
- :mod:`.kv_fragment`: KV free-list layouts and fragmentation measurement;
- :mod:`.metrics`: parsing ``/metrics`` and cross-checking it with our records.
"""
