"""Private layer `_frontends` of lora_guard (see CONTRIBUTING.md, Layout)."""
