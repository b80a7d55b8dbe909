"""The stacks ortlab runs on (ORTModule's frozen one, the newest torch): which Python, lock and torch, what runs where,
how the environment is built and checked."""
