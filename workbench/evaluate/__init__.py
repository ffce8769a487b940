"""Evaluation core: metrics as plain functions, benchmark runners, reports."""
