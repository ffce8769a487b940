"""The improvement loop (Cura): rounds of failure-targeted data with retention anchors, a
LoRA candidate, per-subset guards and a kept-or-reverted decision, with people at the gates."""
