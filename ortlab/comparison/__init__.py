"""A comparison of backends and its advice: the figures side by side, how sure a speed-up is, how ranks were loaded,
across stacks, and which backend to train with."""
