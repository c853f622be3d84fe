"""Frozen, JSON-able records shared by the kernel and the ranks. No torch, no live objects."""
