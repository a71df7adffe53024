"""Private layer `_guarding` of lora_guard (see CONTRIBUTING.md, Layout)."""
