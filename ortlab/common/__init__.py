"""Small helpers every floor uses: closed name sets, lazy exports, quieted warnings and held output, captured output,
compiled kernels, parity mode, matplotlib figures and the cache folder."""
