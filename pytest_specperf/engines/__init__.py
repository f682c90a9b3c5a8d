"""Engines that the plugin can measure: the embedded reference engine and SGLang."""
