"""Small helpers every floor uses: closed name sets, lazy exports, quieted warnings, captured output, compiled kernels,
parity mode."""
