"""Bridges to other continual-learning frameworks, each importing its framework only when used."""
