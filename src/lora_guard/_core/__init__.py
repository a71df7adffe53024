"""Private layer `_core` of lora_guard (see CONTRIBUTING.md, Layout)."""
