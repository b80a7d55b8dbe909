"""A comparison of backends and its advice: the figures side by side, how sure a speed-up is, a comparison across
stacks, and which backend to train with."""
