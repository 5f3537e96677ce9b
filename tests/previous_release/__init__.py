"""Reading code of earlier releases, frozen, for rollback tests."""
