"""A stand-in for torchvision, for the engine tier only (never installed, never imported by
transformers: it goes on ``sys.path`` after transformers has decided torchvision is absent).

sglang 0.5.23 imports ``torchvision.transforms.InterpolationMode`` at module level in its
multimodal helpers, which its LoRA modules import indirectly; the real wheel would pull a
CUDA torch. Nothing here is called by the LoRA code the tier drives.
"""

__version__ = "0.0.0+lora-guard-stand-in"
