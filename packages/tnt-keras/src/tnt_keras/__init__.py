"""Distributed data-parallel training for Keras 3 (work in progress)."""
