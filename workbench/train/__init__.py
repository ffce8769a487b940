"""LoRA supervised fine-tuning: data with assistant-only loss and packing (`data`), training
as a library of sessions with exact resume (`session`), the runnable job on top of it
(`recipe`), adapter export and merge."""
