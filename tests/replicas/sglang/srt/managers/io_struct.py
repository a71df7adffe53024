from dataclasses import dataclass


@dataclass
class LoRAUpdateOutput:
    success: bool
    error_message: str | None = None
    loaded_adapters: dict[str, str] | None = None
