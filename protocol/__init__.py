"""Wire protocol (placeholder)."""
