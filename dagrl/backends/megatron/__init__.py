"""Megatron-core training backend: HF checkpoints in and out, TP/PP/VPP/CP/EP training."""
