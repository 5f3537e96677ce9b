"""Warm spares: the policy (pure), its settings, and the keeper that carries it out."""
