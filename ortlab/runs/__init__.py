"""A run and its folder: what a burst writes, how it is read back, named, listed, recorded and repeated."""
