"""The fabric pool: its two shapes behind one model (``model.py``), variants, layout."""
