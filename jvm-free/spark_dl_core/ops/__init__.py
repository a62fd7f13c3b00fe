"""The op vocabulary (pydantic transforms), their registry, and tokenization."""
