"""LG900 internal-error: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG900",
    slug="internal-error",
    title="A bug in lora_guard's checker",
    summary=(
        "The checker itself failed while checking an adapter: an exception that says "
        "nothing about the adapter's files (a TypeError, KeyError, ... inside lora_guard). "
        "It is reported as a bug with the place it happened, never as a verdict on the "
        "adapter (an unreadable file stays LG108), and the other adapters are still "
        "checked. With LORA_GUARD_DEBUG=1 the exception is raised with its traceback."
    ),
    triggers=(
        "`lg.check_adapters` or `lora-guard check` hitting an unexpected exception in "
        "its own code while reading or checking one adapter.",
    ),
    situations=(
        "An adapter shape or config field the checker was not written for.",
        "A newer PEFT or engine release than this lora_guard knows.",
    ),
    fixes=(
        "Run the check again with LORA_GUARD_DEBUG=1 to get the traceback, and report it "
        "to the lora_guard maintainers (the project's issue tracker) with the traceback "
        "and the adapter's adapter_config.json (no weights needed: the header's keys and "
        "shapes are enough); until it is fixed the adapter is not checked, so do not "
        "serve it on this verdict alone.",
    ),
    example=(
        "# lora-guard check says:\n"
        "# LG900 internal-error: adapter 'math': lora_guard's checker failed with KeyError\n"
        "# ('lora_B') at check_adapters.py:412; this is a bug in lora_guard, not a verdict\n"
        "# on the adapter.\n"
        "LORA_GUARD_DEBUG=1 lora-guard check ./adapters/math   # the traceback to report\n"
    ),
    error="AdapterError",
    messages={
        "internal": (
            "{subject}: lora_guard's checker failed with {error} ({problem}) at {where}; "
            "this is a bug in lora_guard, not a verdict on the adapter."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check"),
)
