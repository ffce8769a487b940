"""Trajectory synthesis: verified data-agent trajectories by Monte Carlo tree search."""
