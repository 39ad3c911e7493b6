"""Generic trio supervision (placeholder, filled in by the supervisor work)."""
