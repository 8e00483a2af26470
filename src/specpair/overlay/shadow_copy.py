"""A private, overlay-able copy of an installed vLLM that costs almost no disk.

``shadow_copy(site, dest)`` mirrors ``site/vllm`` into ``dest/vllm`` as real
directories holding symlinks to the original files. The overlay replaces a
patched file's symlink with a real file (atomic rename), so the original
installation is never written (Python, too, writes bytecode by atomic rename,
so the symlinked ``__pycache__`` entries are replaced, never written through).
Put ``dest`` first on PYTHONPATH to run it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["shadow_copy", "installed_site"]


def installed_site() -> Path | None:
    """The site-packages holding the importable ``vllm`` package (without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    return Path(os.path.abspath(spec.origin)).parent.parent  # no resolve(): shadow copies


def shadow_copy(site: Path, dest: Path) -> Path:
    """Mirror ``site/vllm`` into ``dest/vllm`` (dirs copied, files symlinked); returns dest."""
    src = site / "vllm"
    if not (src / "__init__.py").is_file():
        raise FileNotFoundError(f"no vllm package under {site}")
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        out = dest / "vllm" / rel
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.symlink(Path(root) / name, out / name)
    return dest
