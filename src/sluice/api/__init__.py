"""The REST API (FastAPI), thin over control."""
