"""The drivers' reports: their tables in Markdown and JSON, their figures, publishing, and the summaries of
published tables."""
