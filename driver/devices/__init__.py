"""The typed device model every discovery backend produces and every slice
is built from."""
