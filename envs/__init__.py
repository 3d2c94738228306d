"""Agentic environments and their tools (swe, search, math). No torch."""
