"""Stand-in of the verl package (see ../README.md)."""
