"""Private layer `_checking` of lora_guard (see CONTRIBUTING.md, Layout)."""
