"""The checks of one adapter, by job (see CONTRIBUTING.md: Layout)."""
