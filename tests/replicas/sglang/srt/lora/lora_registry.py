import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoRARef:
    lora_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lora_name: str | None = None
    lora_path: str | None = None
    pinned: bool | None = None
