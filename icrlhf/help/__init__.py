"""Help pages: the README, which ships with the code, read in the app (it works offline)."""
