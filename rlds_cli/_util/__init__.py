"""Helpers every layer shares: files written whole, lazy names, plug points, number and row rules."""
