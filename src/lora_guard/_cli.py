"""Where the ``lora-guard`` console script of installs made before the layout change looks.

The CLI lives in :mod:`lora_guard._frontends.cli`; reinstalling points the script there.
"""

from ._frontends.cli import main

__all__ = ["main"]
