"""LoRA supervised fine-tuning: data with assistant-only loss and packing, an explicit
training loop with exact resume, adapter export and merge."""
