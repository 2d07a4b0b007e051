"""Help pages: the user-facing pages of the repository's docs/ folder, which ship beside the
code, read in the app (it works offline). An install without docs/ shows no pages."""
