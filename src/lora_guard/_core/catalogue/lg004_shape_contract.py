"""LG004 shape-contract: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG004",
    slug="shape-contract",
    title="A call's arguments disagree with their declared dims",
    summary=(
        "The arguments of one call must agree with the dims declared for them: the number "
        "of dims, literal sizes, names bound across arguments (the rank of A and of B), "
        "multiples such as 2*rank, the `where` predicate and the allowed dtypes."
    ),
    triggers=(
        "A `@lg.shapes` call whose tensor has the wrong number of dims, a size that does not "
        "match a literal or a name bound by another argument, or fails `where`.",
        "An argument without a `.shape`.",
    ),
    situations=(
        "A LoRA A weight passed transposed, or A and B from adapters of different ranks.",
        "Fused qkv or gate_up weights stacked with the wrong multiple.",
    ),
    fixes=(
        "Pass tensors whose shapes match the declared dims; the message names the argument, "
        "the dim and the size it expected.",
        "If the declaration is wrong, fix the spec in the @lora_guard.shapes decorator.",
        "Pass tensors of a dtype the guard allows (cast with .to(dtype) before the call), "
        "or widen the guard's dtypes=...; with same_dtype=True every guarded argument must "
        "share one dtype.",
    ),
    variant_fixes={"dtype": 2, "same-dtype": 2},
    example=(
        "@lg.shapes(a='slots rank hidden', b='slots hidden rank')\n"
        "def set_lora(self, a, b): ...\n"
        "pool.set_lora(a, b.transpose(1, 2))   # LG004: b dim 1 is 'hidden' (64), got 16\n"
    ),
    error="ShapeContractError",
    messages={
        "ndim": (
            "{subject}: argument '{argument}' has {ndim} dims (shape {shape}), "
            "but its spec '{spec}' wants {expected_ndim}."
        ),
        "literal": (
            "{subject}: argument '{argument}' dim {axis} is {got} (shape {shape}), "
            "but its spec '{spec}' fixes it at {expected}."
        ),
        "bound": (
            "{subject}: argument '{argument}' dim {axis} should be '{dim}' = {expected} "
            "(bound by argument '{bound_by}'), but it is {got} (shape {shape}; spec '{spec}')."
        ),
        "multiple": (
            "{subject}: argument '{argument}' dim {axis} is {got} (shape {shape}), "
            "which is not a multiple of {factor} as its spec '{spec}' requires."
        ),
        "no-shape": (
            "{subject}: argument '{argument}' is a {type} with no .shape; its spec '{spec}' "
            "wants a tensor."
        ),
        "where": (
            "{subject}: the bound dims {dims} fail the guard's where= predicate."
        ),
        "dtype": (
            "{subject}: argument '{argument}' has dtype {got}, but the guard allows {expected}."
        ),
        "same-dtype": (
            "{subject}: arguments disagree on dtype: {dtypes}."
        ),
        "bad-shape": (
            "{subject}: {problem}; a guarded tensor's .shape must be at most 64 integer "
            "dims, none negative (a regular tensor, not a nested or jagged one)."
        ),
    },
    raised_by=("@lg.shapes", "lg.shapes_conform"),
)
