"""Federated knowledge evolution across sites with Flower (no raw data leaves a site)."""
