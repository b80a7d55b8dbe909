"""ortlab's compatibility fixes, one module each (`FIX`); the registry is `ortlab.compat.registry.FIXES`."""
