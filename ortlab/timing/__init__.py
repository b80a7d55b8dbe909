"""Where a training step's time goes, per backend: the collector "time" (profiled steps, time.json and a
Chrome/Perfetto trace per run), the profilers' files read (`profile`), the tables side by side (`table`:
`ortlab.time`) and the figure (`figures`)."""
