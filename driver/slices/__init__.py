"""ResourceSlice building (pure) and publishing (API writes on change only)."""
