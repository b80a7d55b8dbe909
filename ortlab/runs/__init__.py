"""A run and its folder: what a burst writes as it goes, how every file of it is read back, what it keeps so that a
verdict can be reached anywhere, and how to run it again."""
