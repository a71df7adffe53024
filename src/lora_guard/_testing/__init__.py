"""Private layer `_testing` of lora_guard (see CONTRIBUTING.md, Layout)."""
