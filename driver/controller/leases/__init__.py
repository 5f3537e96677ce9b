"""Device leases: who holds a claim, until when, and taking it back (docs/leases.md)."""
