"""The stacks ortlab runs on (ORTModule's frozen one, the newest torch): which Python, lock and torch each is, what runs
where, the versions a run records, and the build of ORTModule's extensions."""
