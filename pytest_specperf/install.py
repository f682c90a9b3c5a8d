"""The install line every message gives: one that works without a package index.

pytest-specperf is not on a package index, so ``pip install pytest-specperf[sglang]``
fails. A message that says how to install an extra names the source this copy came from,
as pip recorded it (PEP 610 ``direct_url.json``): the git URL at its commit, the
checkout's folder, or the wheel file; a checkout-relative line when this copy was not
installed by pip at all.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

DISTRIBUTION = "pytest-specperf"
#: Where the README's install lines point: a git URL at a tag (replace it with your
#: fork's) or a wheel built from the checkout (``pip wheel --no-deps -w dist .``).
GIT_URL_EXAMPLE = "git+https://github.com/<org>/pytest-specperf@v0.1.0"


def _with_extra(target: str, extra: str | None) -> str:
    return f"{target}[{extra}]" if extra else target


def _path_of(url: str) -> str:
    return unquote(urlparse(url).path)


def install_line(extra: str | None, direct_url: Mapping[str, Any] | None) -> str:
    """``pip install ...`` for ``extra`` (None: the plugin alone) from where this copy
    was installed (``direct_url``: pip's ``direct_url.json``, None when there is none)."""
    url = str((direct_url or {}).get("url", ""))
    vcs = (direct_url or {}).get("vcs_info")
    if url and isinstance(vcs, Mapping):
        rev = vcs.get("requested_revision") or vcs.get("commit_id")
        at = f"@{rev}" if rev else ""
        return (
            f'pip install "{_with_extra(DISTRIBUTION, extra)} @ {vcs.get("vcs", "git")}+{url}{at}"'
        )
    if url.startswith("file:"):
        path = _path_of(url)
        info = (direct_url or {}).get("dir_info")
        if isinstance(info, Mapping):
            editable = "-e " if info.get("editable") else ""
            return f'pip install {editable}"{_with_extra(path, extra)}"'
        return f'pip install "{_with_extra(DISTRIBUTION, extra)} @ {url}"'
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file():
        return f'pip install -e "{_with_extra(str(checkout), extra)}"'
    return (
        f'pip install "{_with_extra(DISTRIBUTION, extra)} @ {GIT_URL_EXAMPLE}" (a git URL at '
        "a tag, or a wheel built from a checkout: pip wheel --no-deps -w dist .)"
    )


@functools.lru_cache(maxsize=1)
def _direct_url() -> Mapping[str, Any] | None:
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def install_hint(extra: str | None = None) -> str:
    """:func:`install_line` for this copy of the plugin."""
    return install_line(extra, _direct_url())
