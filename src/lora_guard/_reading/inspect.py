"""`inspect_adapter`: one adapter, local or remote, read into an `AdapterSpec` (the front of
`adapters`, the local reader, and `remote`, the remote one: both below it, neither importing
the other's front)."""

from __future__ import annotations

import os
import pathlib

from lora_guard._core.config import refuse
from lora_guard._reading.adapters import AdapterSpec, Malformed, load_spec, malformed_violation
from lora_guard._reading.remote import is_remote

__all__ = ["inspect_adapter"]


def inspect_adapter(path: str | os.PathLike[str]) -> AdapterSpec:
    """Read one adapter folder's config and safetensors header into an `AdapterSpec`.

    Never reads tensor data and never unpickles. An adapter that cannot be read safely (a
    missing or invalid ``adapter_config.json``, an invalid or inconsistent header, pickle
    weights, a symlink out of the folder) raises `lora_guard.AdapterError` LG108 naming the
    file and the problem, whatever the mode: there is no spec to return. Serving problems
    (rank, targets, features, dims) are not raised here; `check_adapters` reports them.

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> spec = lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/a", targets=("q_proj",)))
        >>> sorted(spec.modules)
        ['model.layers.0.self_attn.q_proj', 'model.layers.1.self_attn.q_proj']
        >>> lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/old", defects=("pickle-bin",)))
        Traceback (most recent call last):
        ...
        lora_guard.AdapterError: LG108 malformed-adapter: adapter 'old': adapter_model.bin: ...
    """
    if isinstance(path, str) and is_remote(path):
        from lora_guard._reading.remote import (
            inspect_remote,  # the remote extra, imported only when asked
        )

        return inspect_remote(path)
    folder = pathlib.Path(path)
    try:
        return load_spec(folder)
    except Malformed as exc:
        refuse([malformed_violation(f"adapter {folder.name!r}", exc)])
