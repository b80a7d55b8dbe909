"""ipywidgets panels over ortlab's Python API; the Lab composes them."""
