"""Test doubles that the e2e suite and `omnigent mock-llm` share.

The package exists so tests and the CLI can run the scripted mock LLM
(`omnigent.testing.mock_llm`) without reaching for a real provider. It
re-exports nothing on purpose: importing the package must stay free, and
`python -m omnigent.testing.mock_llm` would warn if the package had already
imported that module.
"""
