"""Private layer `_reading` of lora_guard (see CONTRIBUTING.md, Layout)."""
