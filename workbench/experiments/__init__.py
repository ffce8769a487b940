"""Experiments: pipelines composed into one measured comparison (e.g. RF-Agent's base vs RAG
vs SFT table). They sit above the pipelines and call them through the registry and their
public entry points."""
